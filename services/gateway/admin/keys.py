"""Admin REST: API keys, key groups and their members (seed: /v1/internal/model/nothing/*,
master key only). The raw key value is returned once, at creation; only its hash is stored."""

from __future__ import annotations

import hmac
from typing import Any, Literal

import asyncpg
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from services.gateway.admin.admin_auth import require_master
from services.gateway.core.auth import bearer_token
from services.gateway.core.state import gateway_state
from services.gateway.mcp.modes import MODES
from shared.contract.base import ToolArgs
from shared.repositories import keys as keys_repo

PREFIX = "/v1/internal/model/nothing"
PermissionName = Literal["read", "write", "admin"]
# api_keys.daily_limit and fragment_limit are Postgres integers: a larger value is a 422, not a 500.
PG_INTEGER_MAX = 2**31 - 1

# /auth is the check itself, so it sits outside the master-key dependency.
auth_router = APIRouter(prefix=PREFIX)
router = APIRouter(prefix=PREFIX, dependencies=[Depends(require_master)])


class _Body(ToolArgs):
    """Unknown fields ignored; no NUL, NaN or Infinity anywhere, strings bounded (what Postgres
    cannot hold is a 422 here, not a 500 from the INSERT)."""


class AuthBody(_Body):
    key: str | None = None
    accessKey: str | None = None


_DEFAULT_PERMISSIONS: list[PermissionName] = ["read", "write"]


class KeyCreate(_Body):
    name: str = Field(min_length=1, max_length=200)
    permissions: list[PermissionName] = Field(default_factory=_DEFAULT_PERMISSIONS.copy)
    default_workspace: str | None = Field(None, max_length=200)
    allowed_workspaces: list[str] | None = None
    default_mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    daily_limit: int | None = Field(None, ge=0, le=PG_INTEGER_MAX)
    fragment_limit: int | None = Field(None, ge=0, le=PG_INTEGER_MAX)
    symbolic_hard_gate: bool = False


class KeyUpdate(_Body):
    """seed: PUT /keys/:id changes the status; the seed sets api_keys.default_mode from the
    console without naming a route, so this route takes it too (null clears it)."""

    status: Literal["active", "inactive"] | None = None
    default_mode: Literal[MODES] | None = None  # type: ignore[valid-type]


class DailyLimit(_Body):
    daily_limit: int | None = Field(ge=0, le=PG_INTEGER_MAX)


class Workspace(_Body):
    workspace: str | None = Field(max_length=200)


class GroupCreate(_Body):
    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(None, max_length=1000)


class MemberAdd(_Body):
    key_id: str | None = None
    keyId: str | None = None


def _jsonable(row: asyncpg.Record | dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in dict(row).items():
        if hasattr(value, "isoformat"):
            out[name] = value.isoformat()
        elif isinstance(value, tuple):
            out[name] = list(value)
        else:
            out[name] = value
    return out


async def _changed(request: Request) -> None:
    # Key and group changes must not wait out the 10 s credential cache on any replica.
    await gateway_state(request).authenticator.forget_cached()


@auth_router.post("/auth")
async def verify_master(request: Request) -> JSONResponse:
    """seed: the master-key check the console logs in with (Bearer, or {"key"} in the body)."""
    supplied = bearer_token(request.headers.get("authorization"))
    if supplied is None and request.headers.get("content-type", "").startswith("application/json"):
        body = AuthBody.model_validate(await request.json() or {})
        supplied = body.key or body.accessKey
    master = gateway_state(request).settings.access_key
    if not supplied or not master or not hmac.compare_digest(supplied.encode(), master.encode()):
        return JSONResponse({"success": False, "error": "Unauthorized"}, status_code=401)
    return JSONResponse({"success": True})


@router.get("/keys")
async def list_keys(request: Request) -> list[dict[str, Any]]:
    await gateway_state(request).daily_calls.flush()  # calls_today includes the calls counted in Redis
    async with gateway_state(request).pool.acquire() as conn:
        return [_jsonable(r) for r in await keys_repo.list_keys(conn)]


@router.post("/keys", status_code=201)
async def create_key(body: KeyCreate, request: Request) -> dict[str, Any]:
    fields = body.model_dump(exclude={"name"})
    async with gateway_state(request).pool.acquire() as conn:
        raw, row = await keys_repo.create_key(conn, name=body.name, **fields)
    created = {name: row[name] for name in keys_repo.KEY_PUBLIC}
    return {**_jsonable(created), "raw_key": raw}


async def _update(request: Request, key_id: str, **fields: Any) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        row = await keys_repo.update_key(conn, key_id, **fields)
    if row is None:
        raise HTTPException(status_code=404, detail="key not found")
    await _changed(request)
    return _jsonable(row)


@router.put("/keys/{key_id}")
async def set_status(key_id: str, body: KeyUpdate, request: Request) -> dict[str, Any]:
    fields = body.model_dump(include={"status", "default_mode"} & body.model_fields_set)
    if fields.get("status", "") is None:
        raise HTTPException(status_code=422, detail="status must be active or inactive")
    if not fields:
        raise HTTPException(status_code=422, detail="give status and/or default_mode")
    return {"success": True, **(await _update(request, key_id, **fields))}


@router.put("/keys/{key_id}/daily-limit")
async def set_daily_limit(key_id: str, body: DailyLimit, request: Request) -> dict[str, Any]:
    row = await _update(request, key_id, daily_limit=body.daily_limit)
    return {"success": True, "daily_limit": row["daily_limit"]}


@router.patch("/keys/{key_id}/workspace")
async def set_workspace(key_id: str, body: Workspace, request: Request) -> dict[str, Any]:
    row = await _update(request, key_id, default_workspace=body.workspace)
    return {"success": True, "default_workspace": row["default_workspace"]}


@router.delete("/keys/{key_id}")
async def delete_key(key_id: str, request: Request) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        deleted = await keys_repo.delete_key(conn, key_id)
    if not deleted:
        raise HTTPException(status_code=404, detail="key not found")
    await _changed(request)
    return {"success": True}


@router.get("/groups")
async def list_groups(request: Request) -> list[dict[str, Any]]:
    async with gateway_state(request).pool.acquire() as conn:
        return [_jsonable(r) for r in await keys_repo.list_groups(conn)]


@router.post("/groups", status_code=201)
async def create_group(body: GroupCreate, request: Request) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        row = await keys_repo.create_group(conn, body.name, body.description)
    if row is None:
        raise HTTPException(status_code=409, detail="group name already exists")
    return _jsonable(row)


@router.delete("/groups/{group_id}")
async def delete_group(group_id: str, request: Request) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        deleted = await keys_repo.delete_group(conn, group_id)
    if not deleted:
        raise HTTPException(status_code=404, detail="group not found")
    await _changed(request)
    return {"success": True}


@router.get("/groups/{group_id}/members")
async def list_members(group_id: str, request: Request) -> list[dict[str, Any]]:
    async with gateway_state(request).pool.acquire() as conn:
        if not await keys_repo.group_exists(conn, group_id):
            raise HTTPException(status_code=404, detail="group not found")
        return [_jsonable(r) for r in await keys_repo.list_members(conn, group_id)]


@router.post("/groups/{group_id}/members", status_code=201)
async def add_member(group_id: str, body: MemberAdd, request: Request) -> dict[str, Any]:
    key_id = body.key_id or body.keyId
    if not key_id:
        raise HTTPException(status_code=422, detail="key_id is required")
    async with gateway_state(request).pool.acquire() as conn, conn.transaction():
        if not await keys_repo.group_exists(conn, group_id):
            raise HTTPException(status_code=404, detail="group not found")
        if not await keys_repo.add_member(conn, group_id, key_id):
            raise HTTPException(status_code=404, detail="key not found")
    await _changed(request)
    return {"success": True, "group_id": group_id, "key_id": key_id}


@router.delete("/groups/{group_id}/members/{key_id}")
async def remove_member(group_id: str, key_id: str, request: Request) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        removed = await keys_repo.remove_member(conn, group_id, key_id)
    if not removed:
        raise HTTPException(status_code=404, detail="member not found")
    await _changed(request)
    return {"success": True}
