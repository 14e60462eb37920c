"""Reciprocal rank fusion of the search layers' ranked lists."""

from __future__ import annotations

from shared.domain.search import RankedHit

# Cormack et al. (2009): k = 60 is robust across collections.
RRF_K = 60


def fuse_ranked_lists(layers: dict[str, list[tuple[str, float]]], weights: dict[str, float] | None = None) -> list[RankedHit]:
    weights = weights or {}
    hits: dict[str, RankedHit] = {}
    for layer, ranked in layers.items():
        weight = weights.get(layer, 1.0)
        for rank, (fragment_id, _score) in enumerate(ranked):
            hit = hits.setdefault(fragment_id, RankedHit(fragment_id, 0.0))
            hit.score += weight / (RRF_K + rank + 1)
            hit.layers.add(layer)
    return sorted(hits.values(), key=lambda h: h.score, reverse=True)
