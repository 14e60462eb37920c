"""The mnemory REST surface (reference 004) under /api/: memory CRUD, search and find, core
and recent context, categories, session summaries, fsck, and the intelligence layer
(/api/recall, /api/remember); /api/openapi.json and /api/docs. A thin adapter onto the
gateway's core: the work is done by recall, ingest and the worker. Artifacts
(/api/memories/{id}/artifacts...) are artifacts.py's (installed by the app itself); their
operations are in /api/openapi.json too."""

from __future__ import annotations

import importlib
import importlib.util

from fastapi import APIRouter, FastAPI

from services.gateway.mnemory_api import docs, fsck, intelligence, memories, sessions
from services.gateway.mnemory_api.auth import JwtVerifier, MnemoryContext
from shared.memory_sessions import InProcessMemorySessions
from shared.settings import MnemorySettings

_ARTIFACTS = "services.gateway.mnemory_api.artifacts"


ROUTERS = (memories.router, memories.categories_router, sessions.router, fsck.router, intelligence.router)


def documented() -> list[APIRouter]:
    """Every router of the surface, artifacts' included when that module is there."""
    found = list(ROUTERS)
    if importlib.util.find_spec(_ARTIFACTS) is not None:
        found.append(importlib.import_module(_ARTIFACTS).router)
    return found


def install(app: FastAPI, version: str, settings: MnemorySettings | None = None) -> None:
    settings = settings or MnemorySettings()
    app.state.mnemory = MnemoryContext(settings=settings, verifier=JwtVerifier(settings), local_sessions=InProcessMemorySessions())
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(docs.build_router([route for router in documented() for route in router.routes], version))
