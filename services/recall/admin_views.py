"""The admin console's read views, served by recall for the gateway's admin routes (master key
only; never MCP tools: the gateway forwards only the catalog's tools). Each is a handler of the
internal RPC (`POST /v1/tools/admin_*`) answering the wire shape of the seed's admin route;
the SQL is in shared/repositories/admin_views.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from services.common.internal import ToolContext, parse_arguments
from services.recall.service import ReadResources
from shared.contract.base import ToolArgs
from shared.domain.errors import PermissionDenied
from shared.repositories import admin_views as views

# seed: /memory/search-events?days= is clamped to 1..365 (default 7); /memory/fragments pages of
# 1..100 (default 20); /memory/graph limit 10..10000 (default 50).
FragmentType = Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"]
# The window of /stats' observability block (seed: getSearchObservability(7)).
OBSERVABILITY_DAYS = 7
LAYERS = ("L1", "L2", "L3", "total")


class NoArgs(ToolArgs):
    pass


class FragmentsArgs(ToolArgs):
    topic: str | None = Field(None, max_length=200)
    type: FragmentType | None = None
    key_id: str | None = Field(None, max_length=200)
    workspace: str | None = Field(None, max_length=200)
    page: int = Field(1, ge=1, le=1_000_000)
    limit: int = Field(20, ge=1, le=100)


class GraphArgs(ToolArgs):
    topic: str | None = Field(None, max_length=200)
    key_id: str | None = Field(None, max_length=200)
    limit: int = Field(50, ge=10, le=10_000)


class DaysArgs(ToolArgs):
    days: int = Field(7, ge=1, le=365)


class IdArgs(ToolArgs):
    id: str = Field(min_length=1, max_length=200)


class SessionArgs(ToolArgs):
    session_id: str = Field(min_length=1, max_length=400)
    limit: int = Field(20, ge=1, le=200)


def _master(ctx: ToolContext) -> None:
    # The gateway sends these with the master principal only; a forged call with a key's is refused.
    if not ctx.principal.is_master:
        raise PermissionDenied("admin views need the master key")


def _percentiles(samples: list[float]) -> dict[str, Any]:
    """seed SearchMetrics.computePercentiles: nearest-rank over the samples."""
    if not samples:
        return {"p50": None, "p90": None, "p99": None, "count": 0}
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(int(len(ordered) * p), len(ordered) - 1)], 2)

    return {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "count": len(ordered)}


def search_metrics(rows: list[Any]) -> dict[str, Any]:
    """Latency percentiles of the latest recalls, per layer that served them: "L1" the recalls
    answered from the L1 cache, "L2" / "L3" those whose path ran that layer, "total" all. Engram
    records a recall's end-to-end latency, not each layer's, so a layer's figures are the
    latencies of the recalls that used it."""
    by_layer: dict[str, list[float]] = {layer: [] for layer in LAYERS}
    for row in rows:
        path, latency = row["search_path"], float(row["latency_ms"])
        by_layer["total"].append(latency)
        if path.startswith("L1"):
            by_layer["L1"].append(latency)
            continue
        if "L2:" in path:
            by_layer["L2"].append(latency)
        if "L3:" in path or "L3kw:" in path:
            by_layer["L3"].append(latency)
    return {layer: _percentiles(samples) for layer, samples in by_layer.items()}


async def activity(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    _master(ctx)
    parse_arguments(NoArgs, arguments)
    async with res.pool.acquire() as conn:
        rows = await views.recent_fragments(conn, 10, views.ACTIVITY_PREVIEW_CHARS)
    return {"items": rows}, False


async def overview(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    _master(ctx)
    parse_arguments(NoArgs, arguments)
    async with res.pool.acquire() as conn:
        return await views.overview(conn), False


async def fragments(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    _master(ctx)
    args: FragmentsArgs = parse_arguments(FragmentsArgs, arguments)
    async with res.pool.acquire() as conn:
        page = await views.fragments_page(
            conn, topic=args.topic, type_=args.type, key_id=args.key_id, workspace=args.workspace,
            page=args.page, limit=args.limit,
        )
    return page, False


async def fragment(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    _master(ctx)
    args: IdArgs = parse_arguments(IdArgs, arguments)
    async with res.pool.acquire() as conn:
        detail = await views.fragment_detail(conn, args.id)
    if detail is None:
        return {"success": False, "error": "Fragment not found"}, True
    return detail, False


async def graph(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    _master(ctx)
    args: GraphArgs = parse_arguments(GraphArgs, arguments)
    async with res.pool.acquire() as conn:
        return await views.graph(conn, topic=args.topic, key_id=args.key_id, limit=args.limit), False


async def search_events(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    _master(ctx)
    args: DaysArgs = parse_arguments(DaysArgs, arguments)
    await res.effects.flush()  # the latest recalls' events may still be queued
    async with res.pool.acquire() as conn:
        report = await views.search_events(conn, args.days)
        report["searchMetrics"] = search_metrics(await views.latency_samples(conn))
    return report, False


async def stats(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The figures of /stats that live in the store: fragments, queues, searchMetrics,
    observability, the database's size."""
    _master(ctx)
    parse_arguments(NoArgs, arguments)
    await res.effects.flush()
    async with res.pool.acquire() as conn:
        counts = await views.store_counts(conn)
        metrics = search_metrics(await views.latency_samples(conn))
        observed = await views.observability(conn, OBSERVABILITY_DAYS)
    return {"store": counts, "searchMetrics": metrics, "observability": observed}, False


async def session_events(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    _master(ctx)
    args: SessionArgs = parse_arguments(SessionArgs, arguments)
    await res.effects.flush()
    async with res.pool.acquire() as conn:
        return await views.session_events(conn, args.session_id, args.limit), False


def _handler(fn: Any) -> Any:
    async def handle(request: Any, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return await fn(request.app.state.resources, ctx, arguments)

    return handle


TOOL_HANDLERS: dict[str, Any] = {
    "admin_activity": _handler(activity),
    "admin_memory_overview": _handler(overview),
    "admin_memory_fragments": _handler(fragments),
    "admin_memory_fragment": _handler(fragment),
    "admin_memory_graph": _handler(graph),
    "admin_search_events": _handler(search_events),
    "admin_stats": _handler(stats),
    "admin_session_events": _handler(session_events),
}
