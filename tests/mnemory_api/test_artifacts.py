"""Artifacts of the mnemory REST surface (reference 004) on a real stack: bytes on local disk
by default and in an S3-compatible store (moto's server, a real HTTP S3 on loopback) when
configured; signed, expiring download tokens bound to one tenant and one artifact; the size
limit (413); forgetting a memory removes its artifacts, stored objects included; two tenants
never see each other's artifacts."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import jwt
import pytest

from services.stack.supervisor import free_port
from shared.artifacts import tokens
from shared.db import SEARCH_PATH
from shared.settings import GatewaySettings
from tests.support import Stack, call, create_api_key, mcp_session, new_stack_config, running, unique

PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489") + bytes(range(256))
DEV_SECRET = GatewaySettings.model_fields["artifact_token_secret"].default
MAX_BYTES = 512 * 1024  # ARTIFACT_MAX_BYTES' default


async def _memory(stack: Stack, key: str, text: str | None = None) -> str:
    async with mcp_session(stack.mcp_url, key) as s:
        stored = await call(s, "remember", {
            "content": text or f"The deploy runbook lives in the ops wiki ({unique('note')}).",
            "topic": "ops", "type": "fact", "workspace": unique()})
    return str(stored["id"])


def _api(stack: Stack, key: str | None = None) -> httpx.AsyncClient:
    headers = {"X-API-Key": key} if key else {}
    return httpx.AsyncClient(base_url=stack.gateway_url, headers=headers, timeout=60)


async def _storage_key(stack: Stack, artifact_id: str) -> tuple[str, str] | None:
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        row = await conn.fetchrow("SELECT backend, storage_key FROM fragment_artifacts WHERE id = $1", artifact_id)
        return (row["backend"], row["storage_key"]) if row else None
    finally:
        await conn.close()


def _on_disk(storage_key: str) -> Path:
    # The stack's services run in this process's directory with ARTIFACTS_DIR's default.
    return Path(".data/artifacts") / storage_key


async def test_text_artifact_saved_listed_read_in_pages_downloaded_and_deleted(stack: Stack) -> None:
    key, key_id = await create_api_key(stack.database_url)
    memory = await _memory(stack, key)
    text = "# Runbook\n" + "step " * 2000
    async with _api(stack, key) as api:
        saved = await api.post(f"/api/memories/{memory}/artifacts", json={"content": text, "filename": "runbook.md"})
        assert saved.status_code == 200, saved.text
        meta = saved.json()
        assert set(meta) == {"id", "filename", "content_type", "size", "created_at"}
        assert (meta["filename"], meta["content_type"], meta["size"]) == ("runbook.md", "text/markdown", len(text.encode()))
        aid = meta["id"]
        backend, storage_key = await _storage_key(stack, aid) or ("", "")
        assert backend == "disk" and storage_key.startswith(f"{key_id}/{memory}/")
        # The bytes are on disk, not in the row.
        assert _on_disk(storage_key).read_bytes() == text.encode()

        listed = await api.get(f"/api/memories/{memory}/artifacts")
        assert listed.status_code == 200 and [a["id"] for a in listed.json()] == [aid]

        first = (await api.get(f"/api/memories/{memory}/artifacts/{aid}")).json()
        assert first["content"] == text[:5000] and first["has_more"] is True and first["is_text"] is True
        assert first["total_size"] == len(text)
        rest = (await api.get(f"/api/memories/{memory}/artifacts/{aid}", params={"offset": 5000, "limit": 20000})).json()
        assert rest["content"] == text[5000:] and rest["has_more"] is False

        raw = await api.get(f"/api/memories/{memory}/artifacts/{aid}/raw")
        assert raw.status_code == 200 and raw.content == text.encode()
        assert raw.headers["content-type"].startswith("text/markdown")
        assert raw.headers["cache-control"] == "private, no-store"

        deleted = await api.delete(f"/api/memories/{memory}/artifacts/{aid}")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert (await api.get(f"/api/memories/{memory}/artifacts/{aid}")).status_code == 404
        assert (await api.delete(f"/api/memories/{memory}/artifacts/{aid}")).status_code == 404
        assert (await api.get(f"/api/memories/{memory}/artifacts")).json() == []
    assert not _on_disk(storage_key).exists()


async def test_binary_artifact_is_read_as_base64_and_downloaded_as_bytes(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    memory = await _memory(stack, key)
    async with _api(stack, key) as api:
        body = {"content": base64.b64encode(PNG).decode(), "filename": "dot.png", "content_type": "image/png"}
        meta = (await api.post(f"/api/memories/{memory}/artifacts", json=body)).json()
        assert meta["size"] == len(PNG)
        got = (await api.get(f"/api/memories/{memory}/artifacts/{meta['id']}")).json()
        assert got["is_text"] is False and base64.b64decode(got["content"]) == PNG and got["content_type"] == "image/png"
        raw = await api.get(f"/api/memories/{memory}/artifacts/{meta['id']}/raw", headers={"Authorization": f"Bearer {key}"})
        assert raw.content == PNG and raw.headers["content-type"] == "image/png"
        assert raw.headers["content-disposition"] == 'inline; filename="dot.png"'
        bad = await api.post(f"/api/memories/{memory}/artifacts", json={**body, "content": "not base64!"})
        assert bad.status_code == 422


async def test_size_limit_is_enforced_with_413(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    memory = await _memory(stack, key)
    async with _api(stack, key) as api:
        at_limit = {"content": base64.b64encode(b"\x01" * MAX_BYTES).decode(), "content_type": "application/octet-stream"}
        assert (await api.post(f"/api/memories/{memory}/artifacts", json=at_limit)).status_code == 200
        over = {"content": base64.b64encode(b"\x01" * (MAX_BYTES + 1)).decode(), "content_type": "application/octet-stream"}
        refused = await api.post(f"/api/memories/{memory}/artifacts", json=over)
        assert refused.status_code == 413 and "max 524288" in refused.json()["detail"]
        text_over = await api.post(f"/api/memories/{memory}/artifacts", json={"content": "x" * (MAX_BYTES + 1)})
        assert text_over.status_code == 413
        assert len((await api.get(f"/api/memories/{memory}/artifacts")).json()) == 1


async def test_download_tokens_are_signed_expiring_and_bound_to_one_artifact_and_tenant(stack: Stack) -> None:
    key_a, key_a_id = await create_api_key(stack.database_url)
    key_b, key_b_id = await create_api_key(stack.database_url)
    memory_a = await _memory(stack, key_a)
    memory_b = await _memory(stack, key_b)
    async with _api(stack, key_a) as api_a, _api(stack, key_b) as api_b, _api(stack) as anonymous:
        first = (await api_a.post(f"/api/memories/{memory_a}/artifacts", json={"content": "first artifact"})).json()["id"]
        second = (await api_a.post(f"/api/memories/{memory_a}/artifacts", json={"content": "second artifact"})).json()["id"]
        b_art = (await api_b.post(f"/api/memories/{memory_b}/artifacts", json={"content": "tenant b's artifact"})).json()["id"]

        minted = await api_a.post(f"/api/memories/{memory_a}/artifacts/{first}/download-token", json={"ttl": 600})
        assert minted.status_code == 200
        grant = minted.json()
        assert grant["expires_in"] == 600 and grant["size"] == len("first artifact") and grant["filename"] == "note.md"
        assert grant["url"] == f"/api/memories/{memory_a}/artifacts/{first}/raw?token={grant['token']}"
        # The URL alone downloads (no API key), within its lifetime.
        ok = await anonymous.get(grant["url"])
        assert ok.status_code == 200 and ok.content == b"first artifact"
        # Without a token or a key: 401.
        assert (await anonymous.get(f"/api/memories/{memory_a}/artifacts/{first}/raw")).status_code == 401

        # Tampered: one character of the signature changed.
        head, payload, signature = grant["token"].split(".")
        flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
        tampered = await anonymous.get(f"/api/memories/{memory_a}/artifacts/{first}/raw", params={"token": f"{head}.{payload}.{flipped}"})
        assert tampered.status_code == 401
        # Tampered: the claims rewritten (another artifact) under the old signature.
        claims = jwt.decode(grant["token"], options={"verify_signature": False})
        forged = jwt.encode({**claims, "aid": second}, "not-the-secret-but-long-enough-for-hs256", algorithm="HS256")
        assert (await anonymous.get(f"/api/memories/{memory_a}/artifacts/{second}/raw", params={"token": forged})).status_code == 401

        # Expired: a genuine token (the stack's secret) whose lifetime is over.
        expired = tokens.issue(DEV_SECRET, tokens.DownloadGrant(key_a_id, memory_a, first), 60, now=time.time() - 3600)
        refused = await anonymous.get(f"/api/memories/{memory_a}/artifacts/{first}/raw", params={"token": expired})
        assert refused.status_code == 401 and "expired" in refused.json()["detail"]

        # Foreign: a token for one artifact does not open another, even of the same tenant.
        other = await anonymous.get(f"/api/memories/{memory_a}/artifacts/{second}/raw", params={"token": grant["token"]})
        assert other.status_code == 401
        # Foreign tenant: B cannot mint a token for A's artifact, B's token does not open A's
        # artifact, and a genuine token naming B for A's artifact finds nothing.
        assert (await api_b.post(f"/api/memories/{memory_a}/artifacts/{first}/download-token")).status_code == 404
        b_token = (await api_b.post(f"/api/memories/{memory_b}/artifacts/{b_art}/download-token")).json()["token"]
        assert (await anonymous.get(f"/api/memories/{memory_a}/artifacts/{first}/raw", params={"token": b_token})).status_code == 401
        as_b = tokens.issue(DEV_SECRET, tokens.DownloadGrant(key_b_id, memory_a, first), 600)
        assert (await anonymous.get(f"/api/memories/{memory_a}/artifacts/{first}/raw", params={"token": as_b})).status_code == 404
        # The default lifetime is DOWNLOAD_TOKEN_TTL (3600 s), a longer ttl is capped at 86400.
        assert (await api_a.post(f"/api/memories/{memory_a}/artifacts/{first}/download-token")).json()["expires_in"] == 3600
        capped = await api_a.post(f"/api/memories/{memory_a}/artifacts/{first}/download-token", json={"ttl": 10**7})
        assert capped.json()["expires_in"] == 86400


async def test_two_tenants_never_see_each_others_artifacts(stack: Stack) -> None:
    key_a, _ = await create_api_key(stack.database_url)
    key_b, _ = await create_api_key(stack.database_url)
    memory_a = await _memory(stack, key_a)
    async with _api(stack, key_a) as api_a, _api(stack, key_b) as api_b:
        aid = (await api_a.post(f"/api/memories/{memory_a}/artifacts", json={"content": "tenant a only"})).json()["id"]
        base = f"/api/memories/{memory_a}/artifacts"
        assert (await api_b.get(base)).status_code == 404
        assert (await api_b.get(f"{base}/{aid}")).status_code == 404
        assert (await api_b.get(f"{base}/{aid}/raw")).status_code == 404
        assert (await api_b.post(base, json={"content": "b writes onto a's memory"})).status_code == 404
        assert (await api_b.delete(f"{base}/{aid}")).status_code == 404
        # A still has exactly its own artifact.
        assert [a["id"] for a in (await api_a.get(base)).json()] == [aid]
        assert (await api_a.get(f"{base}/{aid}/raw")).content == b"tenant a only"


async def test_a_read_only_key_cannot_save_and_text_secrets_follow_the_write_policy(stack: Stack) -> None:
    writer, _ = await create_api_key(stack.database_url)
    reader, _ = await create_api_key(stack.database_url, permissions=["read"])
    memory = await _memory(stack, writer)
    async with _api(stack, reader) as api_r, _api(stack, writer) as api_w:
        assert (await api_r.post(f"/api/memories/{memory}/artifacts", json={"content": "nope"})).status_code == 403
        secret = "deploy with token ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
        refused = await api_w.post(f"/api/memories/{memory}/artifacts", json={"content": secret})
        assert refused.status_code == 422 and "secret" in refused.json()["detail"]
        assert (await api_w.get(f"/api/memories/{memory}/artifacts")).json() == []


async def test_forgetting_a_memory_removes_its_artifacts_and_their_stored_objects(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    memory = await _memory(stack, key)
    async with _api(stack, key) as api:
        ids = [(await api.post(f"/api/memories/{memory}/artifacts", json={"content": f"artifact {n}"})).json()["id"] for n in range(2)]
        paths = [_on_disk((await _storage_key(stack, aid) or ("", ""))[1]) for aid in ids]
        assert all(p.is_file() for p in paths)
        async with mcp_session(stack.mcp_url, key) as s:
            assert (await call(s, "forget", {"id": memory}))["deleted"] == 1
        assert (await api.get(f"/api/memories/{memory}/artifacts")).status_code == 404
    assert [await _storage_key(stack, aid) for aid in ids] == [None, None]
    assert [p.exists() for p in paths] == [False, False]


# -- S3 ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server as a process on loopback: a real S3 HTTP API, no AWS."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module, no shell
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/moto-api/", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"moto server did not start: {log.read_text()}") from None
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
async def s3_stack(moto_s3: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    data = tmp_path_factory.mktemp("s3-stack")
    config = new_stack_config(data, master_key="s3-master-key", worker=False, beat=False)
    config.extra_env = {
        **config.extra_env,
        "ARTIFACTS_S3_BUCKET": "engram-artifacts", "ARTIFACTS_S3_ENDPOINT": moto_s3,
        "ARTIFACTS_S3_ACCESS_KEY": "testing", "ARTIFACTS_S3_SECRET_KEY": "testing",
        # Not used while S3 is configured: anything written here would be a bug.
        "ARTIFACTS_DIR": str(data / "artifacts-disk"),
    }
    async with running(config) as stack:
        yield stack


def _s3(endpoint: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"], aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"])


async def test_s3_compatible_store_holds_the_bytes_and_forget_removes_them(s3_stack: Stack, moto_s3: str) -> None:
    key, key_id = await create_api_key(s3_stack.database_url)
    memory = await _memory(s3_stack, key)
    async with _api(s3_stack, key) as api:
        body = {"content": base64.b64encode(PNG).decode(), "filename": "dot.png", "content_type": "image/png"}
        aid = (await api.post(f"/api/memories/{memory}/artifacts", json=body)).json()["id"]
        backend, storage_key = await _storage_key(s3_stack, aid) or ("", "")
        assert (backend, storage_key) == ("s3", f"{key_id}/{memory}/{aid}")
        s3 = _s3(moto_s3)
        stored = s3.get_object(Bucket="engram-artifacts", Key=storage_key)
        assert stored["Body"].read() == PNG and stored["ContentType"] == "image/png"
        disk_dir = Path(s3_stack.config.extra_env["ARTIFACTS_DIR"])
        assert not await asyncio.to_thread(disk_dir.exists)

        token = (await api.post(f"/api/memories/{memory}/artifacts/{aid}/download-token")).json()["url"]
        async with _api(s3_stack) as anonymous:
            assert (await anonymous.get(token)).content == PNG
        async with mcp_session(s3_stack.mcp_url, key) as s:
            assert (await call(s, "forget", {"id": memory}))["deleted"] == 1
    listed = s3.list_objects_v2(Bucket="engram-artifacts", Prefix=f"{key_id}/")
    assert listed.get("KeyCount", 0) == 0


async def test_the_rest_delete_of_a_memory_removes_its_artifacts_too(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    memory = await _memory(stack, key)
    async with _api(stack, key) as api:
        aid = (await api.post(f"/api/memories/{memory}/artifacts", json={"content": "goes with its memory"})).json()["id"]
        path = _on_disk((await _storage_key(stack, aid) or ("", ""))[1])
        assert await asyncio.to_thread(path.is_file)
        deleted = await api.delete(f"/api/memories/{memory}")
        assert deleted.status_code == 200, deleted.text
        assert (await api.get(f"/api/memories/{memory}/artifacts/{aid}")).status_code == 404
    assert await _storage_key(stack, aid) is None
    assert not await asyncio.to_thread(path.exists)


async def test_objects_of_memories_deleted_by_other_paths_are_purged_by_the_next_write(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    gone, kept = await _memory(stack, key), await _memory(stack, key)
    async with _api(stack, key) as api:
        aid = (await api.post(f"/api/memories/{gone}/artifacts", json={"content": "orphaned by a cascade"})).json()["id"]
        path = _on_disk((await _storage_key(stack, aid) or ("", ""))[1])
        # Another deletion path (a maintenance merge, a deleted key): the row cascades away and
        # the trigger queues its object; the next artifact write purges the queue.
        conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
        try:
            await conn.execute("DELETE FROM fragments WHERE id = $1", gone)
            assert await conn.fetchval("SELECT count(*) FROM artifact_purge_queue WHERE storage_key LIKE $1", f"%/{aid}") == 1
        finally:
            await conn.close()
        assert await asyncio.to_thread(path.is_file)
        assert (await api.post(f"/api/memories/{kept}/artifacts", json={"content": "a later write"})).status_code == 200
    assert not await asyncio.to_thread(path.exists)


async def test_hostile_inputs_get_4xx_never_a_server_error(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    memory = await _memory(stack, key)
    base = f"/api/memories/{memory}/artifacts"
    async with _api(stack, key) as api:
        aid = (await api.post(base, json={"content": "a fine artifact"})).json()["id"]
        answers = [
            await api.post(base, json={"content": "x", "content_type": "text/plain\r\nX-Injected: 1"}),
            await api.post(base, json={"content": "x", "filename": "../../etc/passwd"}),
            await api.post(base, json={"content": "x", "filename": "\x00"}),
            await api.post(base, json={"content": "x\x00y"}),
            await api.post(base, json={"content": 12}),
            await api.post(f"/api/memories/{'m' * 500}/artifacts", json={"content": "x"}),
            await api.get(f"{base}/{aid}", params={"offset": -1}),
            await api.get(f"{base}/{aid}", params={"offset": 2**40, "limit": 2**40}),
            await api.get(f"{base}/{aid}/raw", params={"token": "not.a.jwt"}),
            await api.get(f"{base}/{aid}/raw", params={"token": "é" * 50}),
            await api.post(f"{base}/{aid}/download-token", json={"ttl": 0}),
            await api.post(f"{base}/{aid}/download-token", json={"ttl": 10**30}),
            await api.delete(f"{base}/{'a' * 300}"),
        ]
        # The filename is cleaned (no path), never refused for its slashes; the artifact reads back.
        saved = answers[1].json()
        assert answers[1].status_code == 200 and "/" not in saved["filename"]
    assert [r.status_code for r in answers if r.status_code >= 500] == []
    assert {r.status_code for r in answers} - {200} <= {401, 404, 413, 422}
