"""POST /memory/import of reference 001, streamed: the gateway forwards the request body as it
came (up to 50 MiB) to `POST /v1/memory/import` here, and the document is read as a stream
of parse events (ijson): one namespace and one entry at a time, written in batches of
IMPORT_BATCH, never one object tree of the whole document.

The body is `{"data": "<the export document as a JSON string>"}`: `data` an object or
missing is a 422, a body or a `data` that is not JSON a 400. The document takes both shapes:
`{"namespace", "entries"}` (a new namespace, always; the reply is that namespace) and
`{"version": 1, "exportedAt", "namespaces": [{"namespace", "entries"}, ...]}` (matched by
name: merge appends, skip leaves it; the reply is MemoryImportSummary). Every namespace and
entry gets a new id; content, source, tags, metadata and timestamps are kept. What an export
can write is taken (no field limits, as the reference says); what is checked: the schema
version, the agent-experience refusals, secrets (ENGRAM_SECRET_POLICY, as on every write),
and the key's fragment quota. The whole import is one transaction: a refusal half way
leaves nothing behind."""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import ijson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.common.rpc import SERVICE_TOKEN_HEADER
from services.ingest.memory_api import holds_nul, new_entry
from services.ingest.service import WriteResources, after_commit, check_quota, invalidate_recall_cache
from shared.domain import memory_banks as banks
from shared.domain.memory_banks import MemoryApiError
from shared.domain.principal import Principal
from shared.domain.secrets import SecretFound, screen_value
from shared.jobs import LINK_TASK, JobBuffer
from shared.read_routing import record_write_position
from shared.repositories import memory_entries as entries_repo
from shared.repositories import namespaces as ns_repo

router = APIRouter()

# Entries embedded and inserted per statement: 256 texts are a few model slices on 2 cores and
# one INSERT ... unnest; the batch is all the document this process holds besides `data`.
IMPORT_BATCH = 256
# ... or fewer when they are long: 209 entries of 100 KB in one INSERT (full-text vectors of
# 20 MB) ran into the pool's 30 s statement timeout on a loaded 2-core machine.
IMPORT_BATCH_CHARS = 2_000_000
# The document is fed to the parser in slices of this many characters.
READ_CHARS = 64 * 1024


class _StringReader:
    """The `data` string as a binary file for ijson, encoded one slice at a time."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0

    def read(self, size: int = -1) -> bytes:
        size = READ_CHARS if size is None or size < 0 else min(size, READ_CHARS)
        chunk = self.text[self.position:self.position + size]
        self.position += len(chunk)
        return chunk.encode("utf-8")


class _BodyReader:
    """The request body stream as an async binary file for ijson."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.pending = b""

    async def read(self, size: int = -1) -> bytes:
        if not self.pending:
            async for chunk in self.chunks:
                if chunk:
                    self.pending = chunk
                    break
        if size is None or size < 0 or size >= len(self.pending):
            out, self.pending = self.pending, b""
        else:
            out, self.pending = self.pending[:size], self.pending[size:]
        return out


async def document_of(body: AsyncIterator[bytes]) -> str:
    """The `data` string of the request body (422 / 400 as the reference orders them)."""
    data: str | None = None
    found = False
    try:
        async for prefix, event, value in ijson.parse_async(_BodyReader(body)):
            if prefix == "" and event not in ("start_map", "end_map", "map_key"):
                raise MemoryApiError(422, "the body must be a JSON object with a string field data")
            if prefix == "data" and event in ("string", "number", "boolean", "null", "start_map", "start_array"):
                found = True
                if event != "string":
                    raise MemoryApiError(422, "data: expected the export document as a JSON string")
                data = value
    except ijson.JSONError:
        raise MemoryApiError(400, "the body is not valid JSON") from None
    if not found or data is None:
        raise MemoryApiError(422, "missing field `data`")
    return data


@dataclass
class _Pending:
    fragments: list[Any] = field(default_factory=list)
    namespaces: list[Any] = field(default_factory=list)
    metadata: list[dict[str, Any] | None] = field(default_factory=list)
    updated: list[Any] = field(default_factory=list)
    chars: int = 0


class MemoryImport:
    """One import: the parse state, the summary, and the batch being written."""

    def __init__(self, res: WriteResources, principal: Principal, on_conflict: str, conn: asyncpg.Connection) -> None:
        self.res = res
        self.principal = principal
        self.on_conflict = on_conflict
        self.conn = conn
        self.jobs: JobBuffer = res.job_buffer()
        self.summary: dict[str, Any] = {"created": [], "merged": [], "skipped": [], "refused": [], "entriesImported": 0}
        self.pending = _Pending()
        self.single: Any = None
        self.redacted: list[str] = []

    def screen(self, path: str, value: Any) -> Any:
        return screen_value(path, value, self.res.settings.secret_policy, self.redacted)

    async def run(self, document: str) -> dict[str, Any]:
        full: bool | None = None
        decided = False  # this block's namespace was read: target is where its entries go
        target: Any = None  # None once decided: skipped or refused, its entries are dropped
        waiting: list[tuple[str, Any]] = []  # entries that came before their namespace
        block, entry = -1, 0
        for prefix, item in _objects(document):
            if prefix == "namespaces":  # the whole-store shape, even with no namespace in it
                full = True
            elif prefix == "version":
                if item != banks.EXPORT_VERSION:
                    raise MemoryApiError(400, f"unsupported export version {item!r}; this server reads version {banks.EXPORT_VERSION}")
            elif prefix == "namespaces.item":  # a block starts
                full, block, entry, decided, target, waiting = True, block + 1, 0, False, None, []
            elif prefix in ("namespaces.item.namespace", "namespace"):
                if prefix == "namespace":
                    full = False if full is None else full
                    target = self.single = await self._single_namespace(item)
                else:
                    target = await self._full_namespace(f"namespaces[{block}].namespace", item)
                decided = True
                for path, held in waiting:
                    await self._entry(path, held, target)
                waiting = []
            elif prefix in ("namespaces.item.entries.item", "entries.item"):
                path = (f"namespaces[{block}].entries[{entry}]" if prefix != "entries.item" else f"entries[{entry}]")
                entry += 1
                if decided:
                    await self._entry(path, item, target)
                else:
                    waiting.append((path, item))
            elif prefix == "":  # the document itself was not an object
                raise MemoryApiError(400, "data: expected an export document (a JSON object)")
        if full is None or (not full and self.single is None):
            raise MemoryApiError(400, "data: not an export document (neither `namespaces` nor `namespace`)")
        await self._flush()
        quota = await check_quota(self.conn, self.principal, 0)
        if quota is not None and quota["remaining"] < 0:
            raise MemoryApiError(403, f"fragment_limit_exceeded: the import needs more than the key's {quota['limit']} fragments")
        if full:
            return self.summary
        return banks.namespace_wire(self.single)

    async def _full_namespace(self, path: str, item: Any) -> Any:
        name, description, enabled = _namespace_fields(path, item)
        if banks.is_agent_experience(description):
            self.summary["refused"].append(name)
            return None
        existing = await ns_repo.find_by_name(self.conn, self.principal.owns, name)
        if existing is not None:
            if banks.is_agent_experience(existing["description"]):
                self.summary["refused"].append(name)
                return None
            if self.on_conflict == "skip":
                self.summary["skipped"].append(name)
                return None
            self.summary["merged"].append(name)
            return existing
        self.summary["created"].append(name)
        return await self._create(path, item, name, description, enabled)

    async def _single_namespace(self, item: Any) -> Any:
        name, description, enabled = _namespace_fields("namespace", item)
        if banks.is_agent_experience(description):
            raise MemoryApiError(400, f"namespace {name!r} is an agent-experience bank; it is not imported")
        return await self._create("namespace", item, name, description, enabled)

    async def _create(self, path: str, item: dict[str, Any], name: str, description: str, enabled: bool) -> Any:
        return await ns_repo.create_namespace(
            self.conn, self.principal.key_id, self.screen(f"{path}.name", name), self.screen(f"{path}.description", description),
            enabled=enabled, created_at=banks.parse_time(item.get("createdAt")), updated_at=banks.parse_time(item.get("updatedAt")),
        )

    async def _entry(self, path: str, item: Any, target: Any) -> None:
        if target is None:
            return
        if not isinstance(item, dict):
            raise MemoryApiError(400, f"{path}: expected an entry object")
        content, source, tags, metadata = item.get("content"), item.get("source"), item.get("tags") or [], item.get("metadata")
        if not isinstance(content, str):
            raise MemoryApiError(400, f"{path}.content: expected a string")
        if source not in banks.SOURCES:
            raise MemoryApiError(400, f"{path}.source: expected one of auto, manual")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise MemoryApiError(400, f"{path}.tags: expected an array of strings")
        if metadata is not None and not isinstance(metadata, dict):
            raise MemoryApiError(400, f"{path}.metadata: expected an object")
        if holds_nul(content) or holds_nul(tags) or holds_nul(metadata):
            raise MemoryApiError(400, f"{path}: the NUL character cannot be stored")
        content = self.screen(f"{path}.content", content)
        tags = self.screen(f"{path}.tags", tags)
        metadata = self.screen(f"{path}.metadata", metadata)
        fragment = new_entry(self.principal, target, content, source, tags)
        created = banks.parse_time(item.get("createdAt"))
        if created is not None:
            fragment.extra["created_at"] = created
        batch = self.pending
        batch.fragments.append(fragment)
        batch.namespaces.append(target["id"])
        batch.metadata.append(metadata)
        batch.updated.append(banks.parse_time(item.get("updatedAt")))
        batch.chars += len(content)
        if len(batch.fragments) >= IMPORT_BATCH or batch.chars >= IMPORT_BATCH_CHARS:
            await self._flush()

    async def _flush(self) -> None:
        batch, self.pending = self.pending, _Pending()
        if not batch.fragments:
            return
        await self.res.embed_fragments(batch.fragments)
        await entries_repo.insert_entries(self.conn, batch.fragments, batch.namespaces, batch.metadata, batch.updated)
        await self.jobs.record(self.conn, LINK_TASK, fragment_ids=[f.id for f in batch.fragments])
        self.summary["entriesImported"] += len(batch.fragments)


def _namespace_fields(path: str, item: Any) -> tuple[str, str, bool]:
    if not isinstance(item, dict):
        raise MemoryApiError(400, f"{path}: expected a namespace object")
    name, description, enabled = item.get("name"), item.get("description", ""), item.get("enabled", True)
    if not isinstance(name, str) or not name:
        raise MemoryApiError(400, f"{path}.name: expected a non-empty string")
    if description is None:
        description = ""
    if not isinstance(description, str) or not isinstance(enabled, bool):
        raise MemoryApiError(400, f"{path}: description must be a string and enabled a boolean")
    if "\x00" in name or "\x00" in description:
        raise MemoryApiError(400, f"{path}: the NUL character cannot be stored")
    return name, description, enabled


_OBJECT_PREFIXES = ("namespaces.item.namespace", "namespaces.item.entries.item", "namespace", "entries.item")


def _objects(document: str) -> Iterator[tuple[str, Any]]:
    """The document as (prefix, value): `version`, the start of each `namespaces` block
    (value None), each namespace object and each entry object, built one at a time."""
    builder: ijson.ObjectBuilder | None = None
    building = ""
    try:
        for prefix, event, value in ijson.parse(_StringReader(document), use_float=True):
            if builder is not None:
                builder.event(event, value)
                if prefix == building and event in ("end_map", "end_array"):
                    yield building, builder.value
                    builder = None
                continue
            if prefix in _OBJECT_PREFIXES and event in ("start_map", "start_array", "string", "number", "boolean", "null"):
                if event in ("start_map", "start_array"):
                    builder, building = ijson.ObjectBuilder(), prefix
                    builder.event(event, value)
                else:
                    yield prefix, value
            elif (prefix == "namespaces.item" and event == "start_map") or (prefix == "namespaces" and event == "start_array"):
                yield prefix, None
            elif prefix == "version" and event in ("number", "string", "boolean", "null"):
                yield prefix, value
            elif prefix == "" and event not in ("start_map", "end_map", "map_key"):
                yield "", value
    except ijson.JSONError:
        raise MemoryApiError(400, "data is not valid JSON") from None


@router.post("/v1/memory/import")
async def import_document(request: Request) -> JSONResponse:
    """The streamed import (services/gateway/memory_api/ forwards the body here as it came)."""
    settings = request.app.state.settings
    supplied = request.headers.get(SERVICE_TOKEN_HEADER, "")
    if not hmac.compare_digest(supplied.encode(), settings.service_token.encode()):
        return JSONResponse({"error": {"code": -32600, "message": "unauthorized caller"}}, status_code=401)
    principal = Principal.from_wire(json.loads(request.headers[banks.PRINCIPAL_HEADER]))
    on_conflict = request.query_params.get("onConflict", "merge")
    res: WriteResources = request.app.state.resources
    try:
        document = await document_of(request.stream())
        async with res.pool.acquire() as conn, conn.transaction():
            importer = MemoryImport(res, principal, on_conflict, conn)
            result = await importer.run(document)
        del document
        await after_commit(res, importer.jobs)
        await invalidate_recall_cache(res, principal)
        await record_write_position(res.pool, res.redis, principal)  # read-your-writes (shared/read_routing.py)
    except MemoryApiError as exc:
        return JSONResponse(exc.to_result(), status_code=exc.status)
    except SecretFound as exc:
        return JSONResponse(MemoryApiError(400, exc.message).to_result(), status_code=400)
    return JSONResponse(result)
