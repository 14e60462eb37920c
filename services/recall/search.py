"""The layered search: L2 BM25, L3 vectors, L2.5 graph hop, neighbouring turns, fusion."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field

import asyncpg
import numpy as np

from services.recall.fusion import FusionInput, fuse_ranked_lists, fuse_scores
from shared.domain.keywords import korean_morphemes
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter, RankedHit
from shared.repositories import fragments as fragments_repo
from shared.repositories import retrieval

# Candidates each layer contributes before fusion; pageSize is at most 50. Depth 50 and 100
# scored the same on LoCoMo dev (0.735 / 0.739); 60 leaves room for a full page.
LAYER_DEPTH = 60
# Seeds whose one-hop graph neighbours join the pool, and how many neighbours at most.
GRAPH_SEEDS = 10
GRAPH_LIMIT = 30


@dataclass
class SearchRequest:
    text: str | None
    keywords: list[str]
    vector: Awaitable[np.ndarray] | None  # embedding runs while the lexical SQL does
    semantic_label: str  # "L3" for text, "L3kw" for the keywords fallback
    threshold: float | None
    filter_only: bool


@dataclass
class SearchOutcome:
    hits: list[RankedHit]
    path: list[str]
    via_graph: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (seed, relation)
    vector: np.ndarray | None = None


def _lexical_extras(text: str | None, keywords: list[str]) -> list[str]:
    extras = [k.lower() for k in keywords]
    if text and any("\uac00" <= ch <= "\ud7a3" for ch in text):
        # The english parser keeps "서버가" whole; the morphemes ("서버") match the index.
        extras.extend(korean_morphemes(text) or [])
    return extras


async def layered_search(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, req: SearchRequest, scope_total: int
) -> SearchOutcome:
    path: list[str] = []
    if req.filter_only:
        ranked = await fragments_repo.filtered_recent(conn, principal, flt, LAYER_DEPTH)
        path.append(f"filter:{len(ranked)}")
        return SearchOutcome(fuse_ranked_lists({"filter": ranked}), path)

    lexical_text = req.text or " ".join(req.keywords)
    lexical, stats, avgdl = await retrieval.lexical_search(
        conn, principal, flt, lexical_text, _lexical_extras(req.text, req.keywords), scope_total, LAYER_DEPTH
    )
    path.append(f"L2:{len(lexical)}")

    semantic: list[tuple[str, float]] = []
    vector = await req.vector if req.vector is not None else None
    if vector is not None:
        semantic = await fragments_repo.vector_candidates(conn, principal, flt, vector, LAYER_DEPTH)
        if req.threshold is not None:
            semantic = [(fid, sim) for fid, sim in semantic if sim >= req.threshold]
        path.append(f"{req.semantic_label}:{len(semantic)}")

    candidates: dict[str, set[str]] = {}
    for layer, ranked in (("L2", lexical), ("L3", semantic)):
        for fid, _ in ranked:
            candidates.setdefault(fid, set()).add(layer)

    seeds = list(dict.fromkeys([fid for fid, _ in lexical[:GRAPH_SEEDS]] + [fid for fid, _ in semantic[:GRAPH_SEEDS]]))
    via_graph: dict[str, tuple[str, str]] = {}
    for seed, other, relation, _weight in await retrieval.graph_neighbours(conn, principal, flt, seeds, GRAPH_LIMIT):
        if other not in candidates:
            via_graph.setdefault(other, (seed, relation))
        candidates.setdefault(other, set()).add("L2.5")
    if via_graph:
        path.append(f"L2.5:{len(via_graph)}")

    neighbours = await retrieval.turn_neighbours(conn, principal, flt, list(candidates))
    pool = set(candidates) | {n for around in neighbours.values() for n in around}
    scored = await retrieval.score_ids(conn, principal, list(pool), stats, avgdl, vector)
    if req.threshold is not None:
        # threshold bounds similarity: a hit only the vector layer proposed must clear it.
        for fid, layers in list(candidates.items()):
            s = scored.get(fid)
            if layers <= {"L3", "L2.5"} and (s is None or s.cosine is None or s.cosine < req.threshold):
                candidates.pop(fid)
    hits = fuse_scores(FusionInput(candidates, scored, neighbours))
    return SearchOutcome(hits, path, via_graph, vector)
