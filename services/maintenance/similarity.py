"""Similar pairs inside tenant+workspace+topic groups, for dedup and contradiction stages.

Only fragments not yet consolidated are compared, against every live fragment of their own
group: a steady-state cycle does (new x group) dot products in numpy instead of a kNN query
per fragment. Groups are keyed by key_id first, so two tenants' fragments are never in one
matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import numpy as np

# Rows of the (new x group) similarity block computed at once: 1024 x 20k floats = 80 MB at
# most, for the largest group the 100k bench produces.
BLOCK_ROWS = 1024


@dataclass(frozen=True)
class SimilarPair:
    a: asyncpg.Record  # the newer of the two
    b: asyncpg.Record
    similarity: float


def _vector(value: object) -> np.ndarray:
    # pgvector's asyncpg codec decodes to its Vector type (to_numpy) in recent versions.
    to_numpy = getattr(value, "to_numpy", None)
    return np.asarray(to_numpy() if to_numpy else value, dtype=np.float32)


def similar_pairs(rows: list[asyncpg.Record], min_similarity: float) -> tuple[list[SimilarPair], list[str]]:
    """Pairs at or above min_similarity, most similar first, and the ids of the new rows."""
    groups: dict[tuple, list[asyncpg.Record]] = {}
    for r in rows:
        groups.setdefault((r["key_id"], r["workspace"], r["topic"]), []).append(r)
    pairs: list[SimilarPair] = []
    new_ids: list[str] = []
    for members in groups.values():
        new_idx = [i for i, r in enumerate(members) if r["is_new"]]
        new_ids.extend(members[i]["id"] for i in new_idx)
        if len(members) < 2 or not new_idx:
            continue
        matrix = np.stack([_vector(r["embedding"]) for r in members])
        is_new = np.array([r["is_new"] for r in members])
        for start in range(0, len(new_idx), BLOCK_ROWS):
            block = new_idx[start:start + BLOCK_ROWS]
            sims = matrix[block] @ matrix.T
            hit_rows, hit_cols = np.nonzero(sims >= min_similarity)
            for i, j in zip(hit_rows.tolist(), hit_cols.tolist(), strict=True):
                src, dst = block[i], j
                # Each unordered pair once: two new rows meet twice, keep src < dst.
                if src == dst or (is_new[dst] and dst < src):
                    continue
                x, y = members[src], members[dst]
                newer, older = (x, y) if x["created_at"] >= y["created_at"] else (y, x)
                pairs.append(SimilarPair(newer, older, float(sims[i, j])))
    pairs.sort(key=lambda p: -p.similarity)
    return pairs, new_ids
