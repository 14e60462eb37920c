"""Admin REST: the memory views and actions of the console (seed: /activity, /memory/overview,
/memory/search-events?days=, /memory/fragments, /memory/graph?topic=&limit=; master key only).

The views are recall's (services/recall/admin_views.py). A fragment's detail reuses recall's
fragment_history and graph_explore tools, and forget / amend go through ingest's tools as the
master key, so validation, secret screening, versions and cache invalidation are the tools' own.
Numeric parameters out of range are clamped (seed: days 1..365, limit 1..100, graph 10..10000).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request

from services.gateway.admin.admin_auth import require_master
from services.gateway.admin.upstream import call_as_master, view

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _given(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value not in (None, "")}


@router.get("/activity")
async def recent_activity(request: Request) -> list[dict[str, Any]]:
    """seed: the latest 10 fragments (an array, newest first)."""
    items: list[dict[str, Any]] = (await view(request, "admin_activity"))["items"]
    return items


@router.get("/memory/overview")
async def memory_overview(request: Request) -> dict[str, Any]:
    return await view(request, "admin_memory_overview")


@router.get("/memory/search-events")
async def memory_search_events(request: Request, days: int = 7) -> dict[str, Any]:
    return await view(request, "admin_search_events", {"days": _clamp(days, 1, 365)})


@router.get("/memory/fragments")
async def memory_fragments(
    request: Request, topic: str | None = None, type: str | None = None, key_id: str | None = None,
    workspace: str | None = None, page: int = 1, limit: int = 20,
) -> dict[str, Any]:
    arguments = _given(topic=topic, type=type, key_id=key_id, workspace=workspace)
    return await view(request, "admin_memory_fragments", {**arguments, "page": _clamp(page, 1, 1_000_000), "limit": _clamp(limit, 1, 100)})


@router.get("/memory/graph")
async def memory_graph(request: Request, topic: str | None = None, limit: int = 50, key_id: str | None = None) -> dict[str, Any]:
    return await view(request, "admin_memory_graph", {**_given(topic=topic, key_id=key_id), "limit": _clamp(limit, 10, 10_000)})


@router.get("/memory/fragments/{fragment_id}")
async def fragment_detail(request: Request, fragment_id: str) -> dict[str, Any]:
    """The fragment (every field), its links both ways, its versions and supersession chain
    (fragment_history) and its causal neighbourhood (graph_explore)."""
    (detail, missing), (history, _), (causal, _) = await asyncio.gather(
        call_as_master(request, "recall", "admin_memory_fragment", {"id": fragment_id}),
        call_as_master(request, "recall", "fragment_history", {"id": fragment_id}),
        call_as_master(request, "recall", "graph_explore", {"startId": fragment_id}),
    )
    if missing:
        raise HTTPException(status_code=404, detail="fragment not found")
    return {
        **detail,
        "versions": history.get("versions", []),
        "versionCount": history.get("versionCount", 0),
        "superseded_by_chain": history.get("superseded_by_chain", []),
        "supersedes": history.get("supersedes", []),
        "causal": {k: causal.get(k, []) for k in ("rootCauses", "resolutions", "effects", "resolves")},
    }


@router.delete("/memory/fragments/{fragment_id}")
async def forget_fragment(request: Request, fragment_id: str, force: bool = False, dryRun: bool = False) -> dict[str, Any]:
    """forget, as the master key: a permanent-tier fragment needs force=true (the tool's rule)."""
    result, is_error = await call_as_master(request, "ingest", "forget", {"id": fragment_id, "force": force, "dryRun": dryRun})
    if is_error:
        _refused(result)
    return result


@router.patch("/memory/fragments/{fragment_id}")
async def amend_fragment(request: Request, fragment_id: str) -> dict[str, Any]:
    """amend, as the master key: the body is amend's arguments (content, topic, keywords, type,
    importance, isAnchor, ...); the path names the fragment."""
    try:
        body = json.loads(await request.body() or b"{}", parse_constant=_no_constant)
    except ValueError:
        raise HTTPException(status_code=400, detail="the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(status_code=400, detail="expected a JSON object of amend's arguments")
    result, is_error = await call_as_master(request, "ingest", "amend", {**body, "id": fragment_id})
    if is_error:
        _refused(result)
    return result


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _refused(result: dict[str, Any]) -> None:
    """A tool's error reply: 404 when the fragment is not there, else 400 with its reason."""
    error = str(result.get("error") or "refused")
    raise HTTPException(status_code=404 if "not found" in error.lower() else 400, detail=error)
