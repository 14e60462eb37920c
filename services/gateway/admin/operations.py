"""Admin REST for what operators script (the `engram` CLI) and the console's "run now":

POST /maintenance/consolidation  start a consolidation cycle of every tenant now (optionally
                                 some stages): ingest's memory_consolidate as the master key,
                                 not waiting; 202 {runId}. Its stage progress and report are
                                 read from GET /maintenance/runs/{runId}.
GET  /export/page?key_id=&topic=&after=&limit=&total=
                                 the export's rows a page at a time (oldest first, as GET
                                 /export streams them) with an opaque `nextCursor`, so a large
                                 export can stop and resume from its last complete page.
Master key only, like every admin route.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import Field

from services.gateway.admin.admin_auth import require_master
from services.gateway.admin.upstream import call_as_master
from services.gateway.core.state import gateway_state
from shared.contract.base import ToolArgs
from shared.repositories import admin_views as views
from shared.repositories import keys as keys_repo

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])

# Rows per export page: default and ceiling (a page of 5,000 export rows is ~5 MB of JSON).
EXPORT_PAGE_DEFAULT = 1000
EXPORT_PAGE_MAX = 5000


class ConsolidationStart(ToolArgs):
    stages: list[str] | None = Field(None, max_length=50)


@router.post("/maintenance/consolidation", status_code=202)
async def start_consolidation(request: Request, body: ConsolidationStart | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"wait": False}
    if body is not None and body.stages:
        arguments["stages"] = body.stages
    result, is_error = await call_as_master(request, "ingest", "memory_consolidate", arguments)
    if is_error or "runId" not in result:
        # Without a broker there is no worker to run the cycle.
        raise HTTPException(status_code=503, detail=result.get("error") or "consolidation could not be queued")
    return {"runId": result["runId"], "status": "queued", "tenant": "all", "stages": arguments.get("stages")}


def _cursor(after: tuple[Any, str] | None) -> str | None:
    if after is None:
        return None
    raw = json.dumps([after[0].isoformat(), after[1]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _parse_cursor(text: str) -> tuple[datetime, str]:
    try:
        stamp, fragment_id = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        return datetime.fromisoformat(stamp), str(fragment_id)
    except (ValueError, TypeError, binascii.Error):
        raise HTTPException(status_code=400, detail="after is not a cursor this route returned") from None


@router.get("/export/page")
async def export_page(
    request: Request, key_id: str | None = None, topic: str | None = None, after: str | None = None,
    limit: int = EXPORT_PAGE_DEFAULT, total: bool = False,
) -> dict[str, Any]:
    pool = gateway_state(request).pool
    key_id = key_id or None
    async with pool.acquire() as conn:
        if key_id and key_id != "master" and await keys_repo.get_key(conn, key_id) is None:
            raise HTTPException(status_code=404, detail="key not found")
        items, last = await views.export_page(
            conn, key_id=key_id, topic=topic or None, after=_parse_cursor(after) if after else None,
            limit=max(1, min(limit, EXPORT_PAGE_MAX)),
        )
        count = await views.export_count(conn, key_id=key_id, topic=topic or None) if total else None
    page_full = len(items) == max(1, min(limit, EXPORT_PAGE_MAX))
    body: dict[str, Any] = {"items": items, "count": len(items), "nextCursor": _cursor(last) if page_full else None}
    if count is not None:
        body["total"] = count
    return body
