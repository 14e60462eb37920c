"""Admin REST: export and import of fragments (seed: /v1/internal/model/nothing/export and
/import; master key only, like every admin route).

GET  /export?key_id=&topic=  JSON Lines, one fragment per line, oldest first: every tenant's
                             fragments, or only key_id's; topic narrows further. Streamed
                             from a database cursor, so a large store never sits in memory.
POST /import[?key_id=]       a JSON array of fragments (an export's lines, or remember-shaped
                             objects; {"fragments": [...]} too), up to 50 MiB. Stored by the
                             ingest service through the write path (validation, secret
                             screening, embeddings) in calls of 200; results are per item
                             (services/ingest/transfer.py says what is kept and how a
                             re-import stays idempotent). key_id puts every item in that
                             tenant; without it each item keeps the key_id it carries.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import StreamingResponse

from services.gateway.admin.admin_auth import require_master
from services.gateway.core.state import gateway_state
from shared.domain.errors import EngramError, Unavailable
from shared.domain.principal import Principal
from shared.repositories import fragment_transfer as transfer_repo
from shared.repositories import keys as keys_repo

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])

# Items per ingest call (services/ingest/transfer.py IMPORT_CHUNK): one bounded transaction each.
IMPORT_CHUNK = 200


@router.get("/export")
async def export_fragments(request: Request, key_id: str | None = None, topic: str | None = None) -> StreamingResponse:
    pool = gateway_state(request).pool
    if key_id:
        async with pool.acquire() as conn:
            if await keys_repo.get_key(conn, key_id) is None:
                raise HTTPException(status_code=404, detail="key not found")

    async def lines() -> AsyncIterator[bytes]:
        async with pool.acquire() as conn, conn.transaction(readonly=True):
            rows = transfer_repo.stream_fragments(conn, all_tenants=not key_id, key_id=key_id or None, topic=topic or None)
            async for row in rows:
                yield (json.dumps(row, ensure_ascii=False) + "\n").encode()

    filename = f"engram-export-{key_id or 'all'}.jsonl"
    return StreamingResponse(
        lines(), media_type="application/x-ndjson", headers={"content-disposition": f'attachment; filename="{filename}"'}
    )


def _items(body: Any) -> list[Any]:
    if isinstance(body, dict):
        body = body.get("fragments")
    if not isinstance(body, list) or not body:
        raise HTTPException(status_code=400, detail="expected a non-empty JSON array of fragments")
    return body


@router.post("/import")
async def import_fragments(request: Request) -> dict[str, Any]:
    try:
        items = _items(json.loads(await request.body()))
    except ValueError:
        raise HTTPException(status_code=400, detail="the body is not valid JSON") from None
    owner: dict[str, Any] = {}
    if request.query_params.get("key_id"):
        key_id = request.query_params["key_id"]
        async with gateway_state(request).pool.acquire() as conn:
            if await keys_repo.get_key(conn, key_id) is None:
                raise HTTPException(status_code=404, detail="key not found")
        owner = {"keyId": key_id}
    totals = {"imported": 0, "existing": 0, "duplicates": 0, "failed": 0}
    results: list[dict[str, Any]] = []
    for start in range(0, len(items), IMPORT_CHUNK):
        try:
            reply, _ = await gateway_state(request).upstreams.call(
                "ingest", "admin_import", {"fragments": items[start:start + IMPORT_CHUNK], **owner}, Principal.master(), None
            )
        except Unavailable as exc:
            raise HTTPException(status_code=503, detail=f"{exc.message}; items from index {start} on were not imported") from None
        except EngramError as exc:
            raise HTTPException(status_code=400, detail=exc.message) from None
        for name in totals:
            totals[name] += reply[name]
        results.extend({**r, "index": r["index"] + start} for r in reply["results"])
    return {"success": True, "total": len(items), **totals, "results": results}
