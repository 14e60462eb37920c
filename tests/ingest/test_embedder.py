"""The embedder's backends: fp32 ONNX, the opt-in int8 quantization of it, and bf16 batches (hybrid)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from shared.embeddings import load_embedder
from shared.embeddings.model import ONNX_FILE, ONNX_INT8_FILE, SMALL_CALL, HybridEmbedder, resolve_backend
from shared.settings import EmbeddingSettings

TEXTS = [
    "postgres: the primary ran out of disk during the nightly vacuum",
    "database: disk full on the main Postgres node while vacuuming at night",
    "frontend: the checkout button is hidden on small screens",
    "billing: invoices are archived after seven years",
]


def test_int8_backend_keeps_the_fp32_neighbourhoods(stack, tmp_path: Path) -> None:
    # The shared stack exported the fp32 model already; the int8 file is made from a copy
    # of it here, so the stacks' shared model cache stays as it is.
    shutil.copy(stack.model_cache / ONNX_FILE, tmp_path / ONNX_FILE)
    fp32 = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path))).embed(TEXTS)
    int8 = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND="onnx-int8")).embed(TEXTS)
    assert (tmp_path / ONNX_INT8_FILE).exists()
    assert int8.shape == fp32.shape == (4, 384)
    assert np.allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    # Close to fp32's vectors, not equal to them (stored vectors differ: hence opt-in).
    agreement = (int8 * fp32).sum(axis=1)
    assert agreement.min() > 0.95 and not np.allclose(int8, fp32, atol=1e-4)
    # The paraphrase stays the nearest neighbour, as with fp32.
    for vectors in (fp32, int8):
        similarity = vectors @ vectors[0]
        assert int(np.argsort(similarity)[-2]) == 1


def test_auto_backend_is_hybrid_only_where_the_cpu_has_amx_bf16() -> None:
    assert resolve_backend("auto", {"avx2", "avx512f", "amx_tile", "amx_bf16"}) == "hybrid"
    assert resolve_backend("auto", {"avx2", "avx512f", "avx512_bf16"}) == "onnx"
    assert resolve_backend("auto", set()) == "onnx"
    assert resolve_backend("onnx-int8", {"amx_bf16"}) == "onnx-int8"


def test_hybrid_backend_serves_few_texts_with_onnx_and_batches_in_bf16(stack, tmp_path: Path) -> None:
    shutil.copy(stack.model_cache / ONNX_FILE, tmp_path / ONNX_FILE)
    fp32 = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND="onnx"))
    hybrid = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND="hybrid"))
    assert isinstance(hybrid, HybridEmbedder)
    batch = TEXTS * 2  # more than SMALL_CALL texts: the bf16 model
    assert len(batch) > SMALL_CALL
    reference = fp32.embed(batch)
    # A query-sized call is fp32 ONNX itself: the same vector, bit for bit.
    assert np.array_equal(hybrid.embed(TEXTS[:1]), reference[:1])
    bf16 = hybrid.embed(batch)
    assert bf16.shape == (len(batch), 384)
    assert np.allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-5)
    # bf16 products, fp32 pooling and normalisation: within cosine 0.999 of fp32's vectors,
    # yet computed differently (not the ONNX path).
    agreement = (bf16 * reference).sum(axis=1)
    assert agreement.min() > 0.999 and not np.array_equal(bf16, reference)
    # Padding is masked: beside a text ten times longer (so padded far more), a text's
    # vector stays where it was.
    padded = hybrid.embed(batch + [" ".join(TEXTS) * 3])
    assert float(padded[0] @ bf16[0]) > 0.9999
    similarity = bf16[: len(TEXTS)] @ bf16[0]
    assert int(np.argsort(similarity)[-2]) == 1
