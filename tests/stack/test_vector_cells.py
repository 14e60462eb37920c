"""bench.vector_cells' parts: the centroids (vector_cells.train, as the worker trains them),
the cells they give, the probed cells' order, and the measured ranking from a few cells
against the exact one on a real Postgres (every cell probed is the exact ranking; one probed
cell returns that cell's rows alone)."""

from __future__ import annotations

import numpy as np

from bench.vector_cells import cells_of, measure_scope, probed_cells
from shared.db import create_pool
from shared.repositories.vector_cells import train
from tests.support import Stack


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _clustered(rng: np.random.Generator, centres: int, per: int, dims: int = 384) -> np.ndarray:
    """`per` unit vectors around each of `centres` random unit directions."""
    anchors = _unit(rng.standard_normal((centres, dims)))
    return _unit(np.repeat(anchors, per, axis=0) + 0.01 * rng.standard_normal((centres * per, dims)))


def test_trained_centroids_are_unit_and_cells_follow_the_nearest_centroid() -> None:
    rng = np.random.default_rng(1)
    x = _clustered(rng, centres=4, per=50)
    centroids = train(x, 4, seed=2)
    assert centroids.shape == (4, 384) and centroids.dtype == np.float32
    assert np.allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=1e-5)
    cells = cells_of(x, centroids)
    assert list(cells) == list(np.argmax(x @ centroids.T, axis=1))
    # each centroid is the mean direction of its cell's rows (spherical k-means' fixed point)
    for cell in set(cells.tolist()):
        mean = x[cells == cell].mean(axis=0)
        assert float(centroids[cell] @ (mean / np.linalg.norm(mean))) > 0.999
    query = x[0]
    assert probed_cells(query, centroids, 1) == [int(cells[0])]
    order = probed_cells(query, centroids, 4)
    assert sorted(order) == [0, 1, 2, 3]
    sims = centroids[order] @ query
    assert all(a >= b for a, b in zip(sims, sims[1:], strict=False))  # nearest cell first


async def test_every_cell_probed_is_the_exact_ranking_and_one_cell_is_its_own_rows(stack: Stack) -> None:
    rng = np.random.default_rng(3)
    vectors = _clustered(rng, centres=8, per=40)
    ids = [f"f{i}" for i in range(len(vectors))]
    importance = [float(w) for w in rng.uniform(0.0, 1.0, len(vectors))]
    # the groups' own directions, so that each cell is one group of 40
    centroids = _unit(np.stack([vectors[g * 40:(g + 1) * 40].mean(axis=0) for g in range(8)]))
    queries = [_unit(vectors[i] + 0.1 * rng.standard_normal(384)) for i in (0, 41, 95, 200, 300)]
    pool = await create_pool(stack.database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            result = await measure_scope(conn, "bench_vector_cells_test", ids, importance, vectors, centroids, queries,
                                         probes=[1, 8], floor=0.3, k=60)
            assert await conn.fetchval("SELECT to_regclass('bench_vector_cells_test')") is None  # dropped after
    finally:
        await pool.close()
    assert result.rows == sum(w >= 0.3 for w in importance)
    assert result.overlap[8] == [1.0] * len(queries) and result.overlap10[8] == [1.0] * len(queries)
    assert result.visited[8] == [1.0] * len(queries)
    # One probed cell (~40 rows, ~28 over the floor, fewer than k): the ranking returns that
    # cell's rows over the floor and no others, so it misses most of the exact top 60.
    cells = cells_of(vectors, centroids)
    for i, query in enumerate(queries):
        (cell,) = probed_cells(query, centroids, 1)
        in_cell = sum(1 for c, w in zip(cells, importance, strict=True) if c == cell and w >= 0.3)
        assert 0 < in_cell < 60
        assert result.returned[1][i] == in_cell
        assert result.visited[1][i] == in_cell / result.rows
        assert result.overlap[1][i] == in_cell / 60
    assert result.returned[8] == [60] * len(queries)
    assert len(result.exact_ms) == len(queries) and len(result.probe_ms[1]) == len(queries)
