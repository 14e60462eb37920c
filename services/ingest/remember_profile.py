"""The remember profile's write (reference 003): `remember(content, path, create_project)`
on Engram's own remember. The path resolves to an owner project (a workspace) or a
namespace (a topic) (shared/domain/logical_path.py); a write outside the key's
allowed_workspaces, to a project that does not exist (without create_project) or under a
reserved path is refused; the content goes through the same secret policy as every
remember. The reply has exactly the documented fields.

A refusal the caller can act on is a tool error whose result says its kind
("authorization_failure", "safety_rejection", "validation_failure") and why."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.common.internal import ToolContext, parse_arguments
from services.ingest import remember as remember_tool
from services.ingest.service import WriteResources, workspace_not_allowed
from shared.contract.base import Label, ToolArgs
from shared.domain import logical_path
from shared.domain.errors import InvalidParams
from shared.domain.fragment import MAX_CONTENT_CHARS, STORED_CONTENT_CHARS
from shared.domain.principal import TenantScope
from shared.domain.secrets import SecretFound
from shared.jobs import JobBuffer
from shared.repositories import profile_projects

ToolResult = tuple[dict[str, Any], bool]
MASTER = "master"


class ProfileRememberArgs(ToolArgs):
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    path: str = Field(min_length=1, max_length=1000)
    create_project: bool = False
    # Set by the gateway from the X-Device-Label header, never by the caller's arguments.
    device_label: Label = "unlabeled"


def refused(kind: str, message: str) -> ToolResult:
    return {"error": kind, "message": message}, True


async def remember(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args: ProfileRememberArgs = parse_arguments(ProfileRememberArgs, arguments)
    if not args.content.strip():
        return refused("validation_failure", "content: must not be empty")
    try:
        target = logical_path.parse(args.path)
    except logical_path.PathRefused as exc:
        kind = {"safety": "safety_rejection", "authorization": "authorization_failure"}.get(exc.kind, "validation_failure")
        return refused(kind, str(exc))
    principal = ctx.principal
    workspace = target.workspace if target.workspace is not None else principal.default_workspace
    if workspace_not_allowed(principal, workspace):
        return refused("authorization_failure", f"path {target.path}: this key may not write to workspace {workspace!r}")
    if target.fragment_type != "episode" and len(args.content.strip()) > STORED_CONTENT_CHARS:
        # Engram stores atomic memories: anything but an episode (…/handoffs, …/notes) is cut
        # at 300 characters, and a cut the caller did not ask for would lose what it said.
        return refused(
            "validation_failure",
            f"content: {len(args.content)} characters; a {target.fragment_type} is at most {STORED_CONTENT_CHARS} "
            "(split it, or store a handoff note under .../handoffs)",
        )
    owner = TenantScope.key(principal.key_id)
    created = False
    if target.project is not None:
        async with res.pool.acquire() as conn:
            known = await profile_projects.exists(conn, owner, target.project)
        if not known and not args.create_project:
            return refused(
                "authorization_failure",
                f"project {target.project!r} does not exist for this account; pass create_project=true to create it",
            )
        created = not known
    stored_args = {
        "content": args.content, "topic": target.topic, "type": target.fragment_type, "workspace": workspace,
        "source": f"remember-profile:{args.device_label}",
    }
    try:
        result, is_error = await remember_tool.remember(res, jobs, ctx, stored_args)
    except SecretFound as exc:
        return refused("safety_rejection", exc.message)
    except InvalidParams as exc:  # too short, a limit: the storage contract
        return refused("validation_failure", exc.message)
    if is_error:
        return refused("validation_failure", str(result.get("error") or result.get("message") or "not stored"))
    if created and target.project is not None:
        async with res.pool.acquire() as conn:
            await profile_projects.create(conn, principal.key_id, target.project)
    return {
        "reference": result["id"],
        "path": target.path,
        "writer": principal.key_name or MASTER,
        "account": principal.key_id or MASTER,
        "device_label": args.device_label,
    }, False
