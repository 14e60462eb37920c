"""The embedder's backends: fp32 ONNX, the opt-in int8 quantization of it, and OpenVINO (bf16 where native)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from shared.embeddings import load_embedder
from shared.embeddings.model import ONNX_FILE, ONNX_INT8_FILE, OpenVinoEmbedder, resolve_backend
from shared.settings import EmbeddingSettings

ROOT = Path(__file__).resolve().parents[2]

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


def test_auto_backend_is_openvino_only_where_the_cpu_has_native_bf16() -> None:
    assert resolve_backend("auto", bf16=True) == "openvino"
    assert resolve_backend("auto", bf16=False) == "onnx"
    assert resolve_backend("onnx-int8", bf16=True) == "onnx-int8"


def test_openvino_backend_keeps_fp32_vectors(stack, tmp_path: Path) -> None:
    shutil.copy(stack.model_cache / ONNX_FILE, tmp_path / ONNX_FILE)
    fp32 = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND="onnx"))
    fast = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND="openvino"))
    assert isinstance(fast.inner, OpenVinoEmbedder)  # inside the timing wrapper (shared/metrics.py)
    batch = TEXTS * 10  # more than one OpenVINO run
    reference = fp32.embed(batch)
    vectors = fast.embed(batch)
    assert vectors.shape == (len(batch), 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # bf16 (where native) or fp32 products, fp32 pooling: within cosine 0.999 of ONNX Runtime's.
    assert (vectors * reference).sum(axis=1).min() > 0.999
    # A single text (a query) and the same text inside a batch padded far longer agree:
    # padding is masked and calls do not leak into each other.
    alone = fast.embed(TEXTS[:1])
    padded = fast.embed(TEXTS[:1] + [" ".join(TEXTS) * 3])
    assert float(alone[0] @ padded[0]) > 0.9999
    similarity = vectors[: len(TEXTS)] @ vectors[0]
    assert int(np.argsort(similarity)[-2]) == 1
    # Two calls at once (one per core) give what one at a time gives.
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(fast.embed, [batch[:20], batch[20:]]))
    assert np.allclose(np.concatenate(together), vectors, atol=1e-3)


def test_batch_size_is_each_backends_default_unless_set(stack, tmp_path: Path) -> None:
    shutil.copy(stack.model_cache / ONNX_FILE, tmp_path / ONNX_FILE)
    cache = str(tmp_path)
    assert load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=cache, EMBEDDING_BACKEND="onnx"))._batch_size == 16
    assert load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=cache, EMBEDDING_BACKEND="openvino"))._batch_size == 32
    chosen = load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=cache, EMBEDDING_BACKEND="openvino", EMBEDDING_BATCH_SIZE=8))
    assert chosen._batch_size == 8
    # Runs of 8 give the vectors one run of 32 gives (length-sorted runs, padding masked).
    assert np.allclose(chosen.embed(TEXTS * 5), load_embedder(
        EmbeddingSettings(EMBEDDING_CACHE_DIR=cache, EMBEDDING_BACKEND="openvino")).embed(TEXTS * 5), atol=2e-3)
    with pytest.raises(ValidationError):
        EmbeddingSettings(EMBEDDING_BATCH_SIZE=0)


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_latency_embedder_gives_one_call_every_core(stack, tmp_path: Path, monkeypatch, backend: str) -> None:
    """Recall loads the model with latency=True: one call at a time on every core (a query
    waits for its vector), unless EMBEDDING_THREADS is set; ingest keeps a lane per core.
    Same vectors either way."""
    import shared.embeddings.model as model

    monkeypatch.setattr(model, "available_cores", lambda: 2)
    shutil.copy(stack.model_cache / ONNX_FILE, tmp_path / ONNX_FILE)
    settings = EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND=backend)
    lanes = load_embedder(settings)
    latency = load_embedder(settings, latency=True)
    assert lanes.parallel_calls == 2 and latency.parallel_calls == 1
    assert load_embedder(settings.model_copy(update={"threads": 1}), latency=True).parallel_calls == 2
    assert np.allclose(latency.embed(TEXTS), lanes.embed(TEXTS), atol=2e-3)


@pytest.mark.parametrize("latency", [False, True], ids=["ingest-lanes", "recall-latency"])
def test_every_openvino_lane_has_run_an_inference_before_the_embedder_is_handed_over(
    stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, latency: bool
) -> None:
    """A freshly started ingest once hung in OpenVINO on its first batch (both lanes' first
    inference at once); each lane now runs one at load, before the service answers /health
    (the lifespan awaits load_embedder)."""
    import shared.embeddings.model as model

    monkeypatch.setattr(model, "available_cores", lambda: 2)  # two lanes on any machine
    shutil.copy(stack.model_cache / ONNX_FILE, tmp_path / ONNX_FILE)
    settings = EmbeddingSettings(EMBEDDING_CACHE_DIR=str(tmp_path), EMBEDDING_BACKEND="openvino")
    embedder = load_embedder(settings, latency=latency).inner
    assert isinstance(embedder, OpenVinoEmbedder)
    assert len(embedder.lanes) == embedder.parallel_calls == (1 if latency else 2)
    # OpenVINO's own record of a request's last inference: 0.0 until it has run one.
    assert all(request.latency > 0 for request in embedder.lanes)


# Loads the model twice in one thread with the same settings and lets both go, then waits for
# SIGTERM as a foreground stack does (services.stack.supervisor.interrupt_on_stop_signals).
LOADS_TWICE_THEN_WAITS = """
import gc, sys, time
from services.stack.supervisor import interrupt_on_stop_signals
from shared.embeddings import load_embedder
from shared.settings import EmbeddingSettings
interrupt_on_stop_signals()
settings = EmbeddingSettings(EMBEDDING_CACHE_DIR=sys.argv[1], EMBEDDING_BACKEND="openvino")
first = load_embedder(settings)
first.embed(["the first load"])
second = load_embedder(settings)
second.embed(["the second load"])
same = first is second
del first, second
gc.collect()
try:
    print("ready", same, flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    print("stopped", flush=True)
"""


def test_a_process_that_loaded_the_model_twice_still_stops_on_sigterm(stack) -> None:  # type: ignore[no-untyped-def]
    """OpenVINO's compile_model puts an alternate signal stack on the calling thread and puts
    back the one it found when the model is freed: two embedders freed in the order they were
    made left the thread's alternate stack on freed memory, and SIGTERM then killed the process
    with a SIGSEGV before it could stop anything (a growth bench's --serve left its whole stack
    running). load_embedder gives one embedder per settings for the life of the process."""
    child = subprocess.Popen(
        [sys.executable, "-c", LOADS_TWICE_THEN_WAITS, str(stack.model_cache)], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        ready = child.stdout.readline()
        assert ready.strip() == "ready True", ready + (child.stderr.read() if child.poll() is not None else "")
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, (child.returncode, err[-2000:])
    assert out.strip() == "stopped"
