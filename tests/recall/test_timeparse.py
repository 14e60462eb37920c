"""timeRange phrases: pure functions, no stack."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from services.recall.timeparse import parse_bound, phrase_span
from shared.domain.errors import InvalidParams

NOW = datetime(2026, 5, 15, 6, 32, tzinfo=timezone.utc)  # Friday 15:32 in Seoul


@pytest.mark.parametrize("phrase", ["yesterday", "어제"])
def test_yesterday_is_the_previous_seoul_day(phrase: str) -> None:
    start, end = phrase_span(phrase, NOW)
    assert start.isoformat() == "2026-05-14T00:00:00+09:00" and end.isoformat() == "2026-05-15T00:00:00+09:00"


@pytest.mark.parametrize(("phrase", "days"), [("last 7 days", 7), ("최근 7일", 7), ("past 2 weeks", 14), ("지난 3일", 3)])
def test_last_n(phrase: str, days: int) -> None:
    start, end = phrase_span(phrase, NOW)
    assert end - start == timedelta(days=days)


def test_ago_and_weeks() -> None:
    assert phrase_span("3 days ago", NOW)[0] == NOW - timedelta(days=3)
    assert phrase_span("3일 전", NOW)[0] == NOW - timedelta(days=3)
    start, end = phrase_span("last week", NOW)
    assert start.isoformat() == "2026-05-04T00:00:00+09:00" and end.isoformat() == "2026-05-11T00:00:00+09:00"
    assert phrase_span("지난주", NOW) == (start, end)


def test_bounds_take_start_or_end_and_iso_passes_through() -> None:
    assert parse_bound("timeRange.from", "today", end=False, now=NOW).isoformat() == "2026-05-15T00:00:00+09:00"
    assert parse_bound("timeRange.to", "yesterday", end=True, now=NOW).isoformat() == "2026-05-15T00:00:00+09:00"
    assert parse_bound("asOf", "2026-01-02T03:04:05Z", end=True) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with pytest.raises(InvalidParams, match="timeRange.from"):
        parse_bound("timeRange.from", "when pigs fly", end=False)
