"""The embedder's backends: fp32 ONNX (the default) and the opt-in int8 quantization of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from shared.embeddings import load_embedder
from shared.embeddings.model import ONNX_FILE, ONNX_INT8_FILE
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
