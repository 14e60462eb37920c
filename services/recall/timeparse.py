"""timeRange bounds: ISO 8601, or a few natural-language phrases (English and Korean).

A phrase names a span ("yesterday", "last week", "지난주", "3 days ago"); `from` takes the
span's start and `to` its end. Anything else is -32602 naming the parameter.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from shared.domain.errors import InvalidParams

KST = ZoneInfo("Asia/Seoul")

_UNITS = {
    "minute": timedelta(minutes=1), "min": timedelta(minutes=1), "분": timedelta(minutes=1),
    "hour": timedelta(hours=1), "시간": timedelta(hours=1),
    "day": timedelta(days=1), "일": timedelta(days=1),
    "week": timedelta(weeks=1), "주": timedelta(weeks=1), "주일": timedelta(weeks=1),
    "month": timedelta(days=30), "달": timedelta(days=30), "개월": timedelta(days=30),
    "year": timedelta(days=365), "년": timedelta(days=365),
}
_AGO = re.compile(r"^(\d+)\s*(minute|min|hour|day|week|month|year|분|시간|일|주일|주|개월|달|년)s?\s*(ago|전)$")
_LAST_N = re.compile(
    r"^(?:last|past|최근|지난)\s*(\d+)\s*(minute|min|hour|day|week|month|year|분|시간|일|주일|주|개월|달|년)s?(?:\s*간|\s*동안)?$"
)


def _day_start(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def phrase_span(phrase: str, now: datetime | None = None) -> tuple[datetime, datetime] | None:
    """The [start, end] a phrase names, in the server's reference zone (KST), or None."""
    now = (now or datetime.now(UTC)).astimezone(KST)
    p = re.sub(r"\s+", " ", phrase.strip().lower())
    today = _day_start(now)
    week = today - timedelta(days=today.weekday())
    month = today.replace(day=1)
    prev_month = (month - timedelta(days=1)).replace(day=1)
    fixed: dict[str, tuple[datetime, datetime]] = {
        "now": (now, now), "지금": (now, now),
        "today": (today, now), "오늘": (today, now),
        "yesterday": (today - timedelta(days=1), today), "어제": (today - timedelta(days=1), today),
        "this week": (week, now), "이번 주": (week, now), "이번주": (week, now),
        "last week": (week - timedelta(weeks=1), week), "지난 주": (week - timedelta(weeks=1), week),
        "지난주": (week - timedelta(weeks=1), week),
        "this month": (month, now), "이번 달": (month, now), "이번달": (month, now),
        "last month": (prev_month, month), "지난 달": (prev_month, month), "지난달": (prev_month, month),
        "this year": (today.replace(month=1, day=1), now), "올해": (today.replace(month=1, day=1), now),
    }
    if p in fixed:
        return fixed[p]
    if m := _AGO.match(p):
        moment = now - int(m.group(1)) * _UNITS[m.group(2)]
        return moment, moment
    if m := _LAST_N.match(p):
        return now - int(m.group(1)) * _UNITS[m.group(2)], now
    return None


def parse_bound(name: str, value: str | None, *, end: bool, now: datetime | None = None) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except ValueError:
        pass
    span = phrase_span(value, now)
    if span is None:
        raise InvalidParams(f"Invalid params: {name}: not an ISO 8601 date-time or a known time phrase: {value!r}")
    return span[1] if end else span[0]
