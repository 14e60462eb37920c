"""admin_import: fragments from a JSON array (an export's lines, or remember-shaped objects)
stored through the write path (seed: POST /v1/internal/model/nothing/import, master key).

Every item gets remember's validation, secret screening (refused naming the kind, or
redacted under ENGRAM_SECRET_POLICY=redact), truncation and keywords, and a fresh embedding
from the same model. Results are per item, as batch_remember's: a refused item never blocks
the others, and everything accepted in one call commits in one transaction.

Re-importing is idempotent: an item's `id` is kept, and an id that already exists (in the
same tenant) answers `existing` without writing; items without an id are de-duplicated by
content within their tenant and workspace, as batch_remember does. An id held by another
tenant's fragment is refused, never overwritten. History comes along (created_at,
valid_from, valid_to); links, access counts and the key quota do not apply (an admin
restore is not a tenant's write).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.common.internal import ToolContext, parse_arguments
from services.ingest.batch import Planned, _insert_isolated, _with_redactions, validate_item
from services.ingest.service import WriteResources, build_fragment
from shared.contract.base import Id, problems
from shared.contract.write import RememberArgs
from shared.domain import fragment as frag
from shared.domain.errors import InvalidParams, PermissionDenied
from shared.domain.principal import Principal
from shared.domain.secrets import SecretFound, find_secrets, secret_kinds
from shared.jobs import LINK_TASK, JobBuffer
from shared.repositories import fragment_transfer as transfer_repo
from shared.repositories import fragments as fragments_repo

# Items per call; the gateway splits a larger import into calls of this size, so each one
# stays one bounded transaction (200 embed + insert in ~1-2 s on 2 cores).
IMPORT_CHUNK = 200
MAX_ID_CHARS = 128

# Export (column) names -> remember's argument names.
_ARGUMENT_NAMES = {
    "is_anchor": "isAnchor", "context_summary": "contextSummary", "session_id": "sessionId",
    "agent_id": "agentId", "case_id": "caseId", "resolution_status": "resolutionStatus",
    "assertion_status": "assertionStatus",
}
_TTL_TIERS = ("hot", "warm", "cold", "permanent")
_WORKSPACE_SOURCES = ("explicit", "key_default", "unscoped")


class ImportArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    fragments: list[Any] = Field(min_length=1, max_length=IMPORT_CHUNK)
    # Every item goes to this tenant (a key id; null = the master key's own). Omitted, each
    # item keeps the key_id it carries, as an export writes it.
    keyId: Id | None = None


def _arguments(item: dict[str, Any]) -> dict[str, Any]:
    args = {_ARGUMENT_NAMES.get(name, name): value for name, value in item.items()}
    # An export writes null for unset enums; remember's defaults stand in for them.
    for name in ("assertionStatus", "affect", "scope", "isAnchor"):
        if args.get(name) is None:
            args.pop(name, None)
    return args


def _timestamp(item: dict[str, Any], name: str) -> datetime | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidParams(f"{name}: expected an ISO 8601 timestamp")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidParams(f"{name}: expected an ISO 8601 timestamp") from None
    if parsed.tzinfo is None:
        raise InvalidParams(f"{name}: the timestamp needs a UTC offset")
    return parsed


def _fragment_of(item: Any, owner: str | None, res: WriteResources) -> frag.NewFragment:
    """One item through remember's validation and screening, with its id and history."""
    if not isinstance(item, dict):
        raise InvalidParams("content is required")
    args = _arguments(item)
    problem = validate_item(args)
    if problem:
        raise InvalidParams(problem)
    fragment_id = item.get("id")
    if isinstance(fragment_id, str) and find_secrets(fragment_id):
        # An id is kept as given and a redacted one is no id: refused under either policy.
        raise SecretFound("id", secret_kinds(find_secrets(fragment_id)))
    if fragment_id is not None and (not isinstance(fragment_id, str) or not 0 < len(fragment_id) <= MAX_ID_CHARS):
        raise InvalidParams(f"id: expected a string of 1 to {MAX_ID_CHARS} characters")
    try:
        parsed = RememberArgs.model_validate({**args, "dryRun": False, "supersedes": None, "linkedTo": None,
                                              "idempotencyKey": None})
    except ValidationError as exc:
        raise InvalidParams(problems(exc)[0]) from None
    ctx = ToolContext(principal=Principal(key_id=owner))
    f = build_fragment(parsed, ctx, res.settings)
    if fragment_id:
        f.id = fragment_id
    if item.get("ttl_tier") in _TTL_TIERS:
        f.ttl_tier = item["ttl_tier"]
    if "case_id" in item:  # as exported, even null: remember's default (the session) is not history
        f.case_id = parsed.caseId
    if item.get("workspace_source") in _WORKSPACE_SOURCES and f.workspace is not None:
        f.workspace_source = item["workspace_source"]
    f.valid_from = _timestamp(item, "valid_from")
    for name in ("valid_to", "created_at"):
        stamp = _timestamp(item, name)
        if stamp is not None:
            f.extra[name] = stamp
    return f


def _owner(args: ImportArgs, item: Any) -> str | None:
    if "keyId" in args.model_fields_set:
        return args.keyId
    return item.get("key_id") if isinstance(item, dict) else None


async def import_fragments(
    res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    if not ctx.principal.is_master:
        raise PermissionDenied("admin_import needs the master key")
    args: ImportArgs = parse_arguments(ImportArgs, arguments)
    results: list[dict[str, Any] | None] = [None] * len(args.fragments)
    planned: Planned = []
    with_ids = {i for i, item in enumerate(args.fragments) if isinstance(item, dict) and item.get("id")}
    for i, item in enumerate(args.fragments):
        try:
            planned.append((i, _fragment_of(item, _owner(args, item), res), None))
        except InvalidParams as exc:
            results[i] = {"index": i, "success": False, "error": exc.message}

    async with res.pool.acquire() as conn:
        owners = {f.key_id for _, f, _ in planned if f.key_id is not None}
        known = await transfer_repo.known_key_ids(conn, sorted(owners))
        existing = await transfer_repo.existing_owners(conn, [f.id for _, f, _ in planned])
        fresh: Planned = []
        seen_ids: set[str] = set()
        for i, f, key in planned:
            if f.key_id is not None and f.key_id not in known:
                results[i] = {"index": i, "success": False, "error": f"unknown key_id {f.key_id}"}
            elif f.id in existing or f.id in seen_ids:
                if f.id in existing and existing[f.id] != f.key_id:
                    results[i] = {"index": i, "success": False, "error": f"id {f.id} belongs to another tenant's fragment"}
                else:
                    results[i] = {"index": i, "success": True, "id": f.id, "existing": True}
            else:
                seen_ids.add(f.id)
                fresh.append((i, f, key))
        fresh = await _without_duplicates(conn, [p for p in fresh if p[0] not in with_ids], results) + [
            p for p in fresh if p[0] in with_ids]
        fresh.sort(key=lambda p: p[0])

    if fresh:
        await res.embed_fragments([f for _, f, _ in fresh])
        async with res.pool.acquire() as conn, conn.transaction():
            inserted = await _insert_isolated(conn, ctx.principal, fresh, results)
            if inserted:
                await jobs.record(conn, LINK_TASK, fragment_ids=inserted)
        _with_redactions(results, fresh)

    final = [r for r in results if r is not None]
    return {
        "success": True,
        "imported": sum(1 for r in final if r["success"] and not r.get("existing") and not r.get("duplicate")),
        "existing": sum(1 for r in final if r.get("existing")),
        "duplicates": sum(1 for r in final if r.get("duplicate")),
        "failed": sum(1 for r in final if not r["success"]),
        "results": final,
    }, False


async def _without_duplicates(conn: Any, fresh: Planned, results: list[Any]) -> Planned:
    """Items that carry no id of their own: one fragment per content, tenant and workspace
    (an earlier import of the same array stored them under new ids)."""
    by_owner: dict[str | None, list[tuple[int, frag.NewFragment]]] = {}
    for i, f, _ in fresh:
        by_owner.setdefault(f.key_id, []).append((i, f))
    duplicates: set[int] = set()
    for owner, items in by_owner.items():
        principal = Principal(key_id=owner)
        found = await fragments_repo.find_by_hash(conn, principal, [(f.content_hash, f.workspace) for _, f in items])
        for i, f in items:
            dup = found.get((f.content_hash, f.workspace))
            if dup:
                results[i] = {"index": i, "success": True, "id": dup, "duplicate": True}
                duplicates.add(i)
            else:  # the same content twice in one import: the first one stands
                found[(f.content_hash, f.workspace)] = f.id
    return [(i, f, key) for i, f, key in fresh if i not in duplicates]
