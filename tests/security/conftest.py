"""Hostile review of the credential paths of today's surfaces: helpers for making tenants,
OAuth tokens, and changing keys and groups through the admin API (as an operator would)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from services.stack.supervisor import Stack
from shared.db import SEARCH_PATH
from shared.repositories import oauth as oauth_repo
from tests.support import unique

ADMIN = "/v1/internal/model/nothing"
MEMORY = "/api/v1/memory"
WAIT = 120.0  # generous: 2 cores shared by many test processes


def http(stack: Stack, headers: Any = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.gateway_url, headers=headers, timeout=WAIT)


async def admin(stack: Stack, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async with http(stack, {"Authorization": f"Bearer {stack.master_key}"}) as client:
        reply = await client.request(method, f"{ADMIN}{path}", **kwargs)
    assert reply.status_code < 300, reply.text
    return reply


async def deactivate(stack: Stack, key_id: str) -> None:
    await admin(stack, "PUT", f"/keys/{key_id}", json={"status": "inactive"})


async def delete_key(stack: Stack, key_id: str) -> None:
    await admin(stack, "DELETE", f"/keys/{key_id}")


async def oauth_token(stack: Stack, key_id: str | None) -> str:
    """An OAuth access token as /token issues it (oat_…), for `key_id` (None: consented with
    the master key), written straight to the database."""
    token = "oat_" + secrets.token_urlsafe(32)
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        client_id = unique("client")
        await oauth_repo.create_client(conn, client_id=client_id, client_name=client_id,
                                       redirect_uris=["http://127.0.0.1:9/cb"], key_id=key_id, metadata={})
        await oauth_repo.create_token(conn, token=token, client_id=client_id, key_id=key_id, scopes=[],
                                      expires_at=datetime.now(UTC) + timedelta(hours=1))
    finally:
        await conn.close()
    return token
