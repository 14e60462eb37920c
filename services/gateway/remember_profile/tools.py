"""The remember profile's tools (reference 003): `remember(content, path, create_project)` and
the read tools 003 names for confirming a write, `search_memory(query, limit)`, `recall` and
`recall_context`, each scoped by an optional `path`. Arguments are exactly these: a reserved
identity field (writer, account, device label, owner, ...) is refused as a safety rejection,
any other unknown argument as a validation failure."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.contract.base import problems

# Identity the server states from the credential and the device header; a caller naming one
# of these is trying to write as someone else (003: "reserved identity metadata").
RESERVED_IDENTITY = frozenset({
    "writer", "writeridentity", "account", "accountid", "device", "devicelabel", "owner", "ownerid",
    "keyid", "keyname", "agentid", "userid", "user", "tenant", "tenantid", "identity", "author", "createdby",
})


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RememberArgs(_Args):
    content: str = Field(min_length=1, max_length=4000, description=(
        "The durable memory: factual, bounded, free of secrets (passwords, bearer tokens, API keys, private keys "
        "are refused or redacted). At most 300 characters, except under a .../handoffs or .../notes path (4000)."))
    path: str = Field(min_length=1, max_length=200, description=(
        "Logical location tying the memory to a project or a permanent namespace, e.g. projects/memory-os/decisions "
        "(owner project memory-os, topic decisions) or preferences/editor (a namespace). The last segment sets the kind: "
        "decisions, preferences, procedures, errors, handoffs / notes; anything else is a fact."))
    create_project: bool = Field(False, description=(
        "Create the owner project when the path implies one (projects/<name>/...) and it does not exist yet "
        "(default false: a write to an unknown project is refused)."))


class SearchArgs(_Args):
    query: str = Field(min_length=1, max_length=4000, description="What to look for (meaning and keywords).")
    limit: int = Field(5, ge=1, le=50, description="Most memories returned (default 5, at most 50).")
    path: str | None = Field(None, min_length=1, max_length=200, description=(
        "Only memories under this logical path: projects/<name> for a whole project, or an exact namespace / topic."))


class RecallArgs(_Args):
    query: str | None = Field(None, min_length=1, max_length=4000, description="What the next task is about (optional with path).")
    path: str | None = Field(None, min_length=1, max_length=200, description="Only memories under this logical path.")
    limit: int = Field(3, ge=1, le=20, description="Most memories returned (default 3).")


class RecallContextArgs(_Args):
    path: str | None = Field(None, min_length=1, max_length=200, description="The project (projects/<name>) to build the pack for.")
    token_budget: int = Field(1000, ge=100, le=20000, description="Most tokens the pack may use (default 1000).")


TOOLS: dict[str, tuple[type[_Args], str, str | None, bool]] = {
    # name: (arguments, description, permission, read-only)
    "remember": (RememberArgs, (
        "Store a durable memory (a fact, preference, decision or verified handoff note) under a logical path, once the "
        "capture policy, scope and secret-redaction checks pass. Replies with the stored reference (opaque), the logical "
        "path, the writer identity, the account and the device label. Confirm the write with search_memory."), "write", False),
    "search_memory": (SearchArgs, (
        "Search durable memories by meaning and keywords, optionally only under a logical path: the way to confirm a "
        "remember (read-after-write through a scoped search)."), "read", True),
    "recall": (RecallArgs, "Fetch a few memories related to a query and/or a logical path.", "read", True),
    "recall_context": (RecallContextArgs, (
        "A bounded context pack (within token_budget) of a project's durable memories, before a later task."), "read", True),
}


def listing() -> list[types.Tool]:
    out = []
    for name, (model, description, _permission, read_only) in TOOLS.items():
        schema = model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema["additionalProperties"] = False
        out.append(types.Tool(
            name=name, description=description, input_schema=schema,
            annotations=types.ToolAnnotations(
                read_only_hint=read_only, destructive_hint=False, idempotent_hint=read_only, open_world_hint=False),
        ))
    return out


class ArgumentRefused(ValueError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "validation_failure" (-32602) or "safety_rejection"


def reserved_names(arguments: dict[str, Any]) -> list[str]:
    return sorted(k for k in arguments if k.replace("_", "").replace("-", "").lower() in RESERVED_IDENTITY)


def parse(model: type[_Args], arguments: dict[str, Any]) -> Any:
    reserved = reserved_names(arguments)
    if reserved:
        raise ArgumentRefused(
            "safety_rejection", f"reserved identity metadata: {', '.join(reserved)} is stated by the server, never by the caller")
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise ArgumentRefused("validation_failure", "Invalid params: " + "; ".join(problems(exc))) from None
