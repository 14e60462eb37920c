"""Content with passages is embedded once, as its passages (issue 22 item 2): the model runs
each passage and pools the fragment's own embedding from those runs, instead of also running
the whole text (shared.domain.passages.pooled_inputs, WriteResources.embed_content)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from services.ingest.service import WriteResources
from shared.domain import passages
from shared.embeddings import load_embedder
from shared.embeddings.model import ONNX_FILE, TOKENIZER_FILE
from shared.settings import EmbeddingSettings
from tests.ingest.helpers import db
from tests.support import Stack, call, mcp_session, unique

LONG = ("[9:00 am on 3 May, 2024] Melanie: We went camping by the lake last weekend. The kids loved the canoe. "
        "I finished a pottery bowl on Sunday. Work has been busy.")
SHORT = "[9:05 am on 3 May, 2024] Caroline: That sounds like a lovely weekend."


class Counting:
    """The real embedder, counting the texts the model runs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.texts: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return self.inner.embed(texts)

    def embed_sums(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return self.inner.embed_sums(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def test_a_fragment_with_passages_runs_the_model_on_its_passages_only(stack: Stack, tmp_path: Path) -> None:
    for name in (ONNX_FILE, TOKENIZER_FILE):
        shutil.copy(stack.model_cache / name, tmp_path / name)
    for backend in ("openvino", "onnx"):
        embedder = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND=backend))
        counting = Counting(embedder)
        res = WriteResources(pool=None, embedder=counting)  # type: ignore[arg-type]
        [(long_vector, long_passages), (short_vector, short_passages)] = anyio.run(
            res.embed_content, [("chat", LONG), ("chat", SHORT)])
        parts = passages.passages(LONG)
        assert len(parts) == 2
        # Three texts, not four: the long turn's own text is not run.
        assert sorted(counting.texts) == sorted([*parts, passages.embedding_text("chat", SHORT)])

        # The passages' vectors are what embedding them alone gives (recall's best passage).
        alone = embedder.embed(parts)
        assert long_passages.shape == (2, 384)
        assert (long_passages * alone).sum(axis=1).min() > 0.9999
        # The fragment's: the mean of every token state of its passages' runs ...
        sums = embedder.embed_sums(parts)
        expected = _unit(sums[:, :-1].sum(axis=0) / sums[:, -1].sum())
        assert float(long_vector @ expected) > 0.9999
        assert abs(float(np.linalg.norm(long_vector)) - 1) < 1e-5
        # ... close to the whole text run on its own, and not the same vector as either passage.
        whole = embedder.embed([passages.embedding_text("chat", LONG)])[0]
        assert float(long_vector @ whole) > 0.85
        assert float((alone @ long_vector).max()) < 0.99
        # Content of one sentence: its own text, as before, and no passages.
        assert float(short_vector @ embedder.embed([passages.embedding_text("chat", SHORT)])[0]) > 0.9999
        assert short_passages.shape == (0, 384)


def test_pooled_inputs_embed_each_fragment_as_its_passages_or_its_own_text() -> None:
    texts, spans = passages.pooled_inputs([("ops", LONG), (None, "Short one."), ("ops", "Two here. And two.")])
    assert texts == [*passages.passages(LONG), "Short one.", "ops: Two here. And two."]
    assert spans == [(0, 2), (2, 0), (3, 0)]
    # The old inputs ran the long turn's own text as well.
    old, _ = passages.embedding_inputs([("ops", LONG), (None, "Short one."), ("ops", "Two here. And two.")])
    assert len(old) == len(texts) + 1


async def test_batch_remember_stores_the_pooled_embedding_and_finds_a_sentence(stack: Stack) -> None:
    ws = unique()
    async with mcp_session(stack.mcp_url, stack.master_key) as s:
        batch = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": LONG, "topic": "chat", "type": "episode", "idempotencyKey": f"{ws}-long"},
            {"content": SHORT, "topic": "chat", "type": "episode"}]})
        long_id, short_id = (r["id"] for r in batch["results"])
        again = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": LONG, "topic": "chat", "type": "episode", "idempotencyKey": f"{ws}-long"}]})
        assert again["results"][0] == {"index": 0, "success": True, "id": long_id, "idempotent": True}
        found = await call(s, "recall", {"text": "who made a pottery bowl?", "workspace": ws, "pageSize": 2})
    assert next(f["id"] for f in found["fragments"]) == long_id

    embedder = load_embedder()
    sums = embedder.embed_sums(passages.passages(LONG))
    expected = _unit(sums[:, :-1].sum(axis=0) / sums[:, -1].sum())
    async with db(stack.database_url) as conn:
        stored = json.loads(await conn.fetchval("SELECT embedding::text FROM fragments WHERE id = $1", long_id))
        stored_short = json.loads(await conn.fetchval("SELECT embedding::text FROM fragments WHERE id = $1", short_id))
        passage_rows = await conn.fetchval("SELECT count(*) FROM fragment_passages WHERE fragment_id = $1", long_id)
    assert float(np.asarray(stored) @ expected) > 0.999
    assert float(np.asarray(stored_short) @ embedder.embed([passages.embedding_text("chat", SHORT)])[0]) > 0.999
    assert passage_rows == 2
