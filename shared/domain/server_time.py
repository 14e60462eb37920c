"""seed _meta.serverTime: the server's clock in four fields, so a client's model does not
reason from its training-time date."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

KST = ZoneInfo("Asia/Seoul")
_WEEKDAYS_KO = "월화수목금토일"


def server_time(now: datetime | None = None) -> dict[str, Any]:
    now = now or datetime.now(UTC)
    kst = now.astimezone(KST)
    return {
        "iso": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "epoch_ms": int(now.timestamp() * 1000),
        "display_kst": f"{kst.year}년 {kst.month}월 {kst.day}일 ({_WEEKDAYS_KO[kst.weekday()]}) {kst:%H:%M}",
        "timezone": "Asia/Seoul",
    }
