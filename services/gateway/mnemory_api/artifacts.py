"""Artifacts of the mnemory REST surface (reference 004): files attached to a memory.

    POST   /api/memories/{id}/artifacts                         save (text, or base64 for binary)
    GET    /api/memories/{id}/artifacts                         list
    GET    /api/memories/{id}/artifacts/{aid}                   read (JSON; base64 for binary)
    POST   /api/memories/{id}/artifacts/{aid}/download-token    a signed, expiring download URL
    GET    /api/memories/{id}/artifacts/{aid}/raw               the bytes (?token= or the API key)
    DELETE /api/memories/{id}/artifacts/{aid}                   delete

The gateway authenticates, maps the wire format and signs / checks download tokens; ingest
writes (artifact_save, artifact_delete) and recall reads (artifact_list, artifact_read), each
with the storage (disk or S3) behind it. Request and reply shapes follow the reference's
implementation (mnemory): save takes {content, filename="note.md", content_type="text/markdown"}
and answers {id, filename, content_type, size, created_at}."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from services.gateway.core.state import gateway_state
from services.gateway.mnemory_api.auth import MnemoryCaller, reader, writer
from shared.artifacts import content as artifact_content
from shared.artifacts import tokens
from shared.domain.errors import EngramError
from shared.domain.principal import Principal

router = APIRouter(prefix="/api/memories", tags=["artifacts"])
# The surface's own callers (mnemory_api/auth.py): an API key (Bearer / X-API-Key) or an ES256
# JWT; 401 without one, 403 without the permission.
Reader = Annotated[MnemoryCaller, Depends(reader)]
Writer = Annotated[MnemoryCaller, Depends(writer)]


class SaveArtifactRequest(BaseModel):
    content: str = Field(description="Text (content_type text/*) or base64-encoded binary content")
    filename: str = Field(artifact_content.DEFAULT_FILENAME, description="Artifact filename")
    content_type: str = Field(artifact_content.DEFAULT_CONTENT_TYPE, description="MIME type")


class DownloadTokenRequest(BaseModel):
    ttl: int | None = Field(
        None, ge=1, description="Token lifetime in seconds (default DOWNLOAD_TOKEN_TTL, capped at DOWNLOAD_TOKEN_MAX_TTL)")


class ArtifactMetadata(BaseModel):
    id: str
    filename: str
    content_type: str
    size: int
    created_at: str


class ArtifactContent(BaseModel):
    content: str
    total_size: int
    offset: int
    is_text: bool
    has_more: bool
    content_type: str
    filename: str


class DownloadTokenResponse(BaseModel):
    token: str
    url: str
    expires_in: int
    content_type: str
    filename: str
    size: int


def _detail(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def _call(
    service: str, tool: str, arguments: dict[str, Any], principal: Principal, request: Request,
) -> dict[str, Any] | JSONResponse:
    """The internal tool's result, or its refusal as the REST status it names."""
    try:
        result, is_error = await gateway_state(request).upstreams.call(service, tool, arguments, principal, None)
    except EngramError as exc:  # invalid arguments, a secret refused by the write policy
        return _detail(422, exc.message)
    if is_error:
        return _detail(int(result.get("status", 500)), str(result.get("detail", "error")))
    return result


@router.post("/{memory_id}/artifacts", response_model=ArtifactMetadata, summary="Save artifact")
async def save_artifact(memory_id: str, body: SaveArtifactRequest, request: Request, who: Writer) -> Any:
    principal = who.principal
    limit = gateway_state(request).settings.artifact_max_bytes
    # Early 413 from the encoded length (ingest checks the decoded bytes exactly).
    if artifact_content.decoded_size_bound(body.content, body.content_type) > limit + 2:
        return _detail(413, f"Artifact too large (max {limit} bytes)")
    return await _call("ingest", "artifact_save", {"memory_id": memory_id, **body.model_dump()}, principal, request)


@router.get("/{memory_id}/artifacts", response_model=list[ArtifactMetadata], summary="List artifacts")
async def list_artifacts(memory_id: str, request: Request, who: Reader) -> Any:
    principal = who.principal
    result = await _call("recall", "artifact_list", {"memory_id": memory_id}, principal, request)
    return result if isinstance(result, JSONResponse) else result["artifacts"]


@router.get("/{memory_id}/artifacts/{artifact_id}", response_model=ArtifactContent, summary="Get artifact")
async def get_artifact(
    memory_id: str, artifact_id: str, request: Request, who: Reader,
    offset: int = Query(0, ge=0, description="Character offset (text artifacts)"),
    limit: int = Query(artifact_content.DEFAULT_READ_LIMIT, ge=1, description="Max characters to return (text artifacts)"),
) -> Any:
    principal = who.principal
    arguments = {"memory_id": memory_id, "artifact_id": artifact_id, "offset": offset, "limit": limit}
    return await _call("recall", "artifact_read", arguments, principal, request)


@router.post(
    "/{memory_id}/artifacts/{artifact_id}/download-token", response_model=DownloadTokenResponse,
    summary="Generate a signed download token",
)
async def create_download_token(
    memory_id: str, artifact_id: str, request: Request, who: Reader, body: DownloadTokenRequest | None = Body(None),  # noqa: B008
) -> Any:
    principal = who.principal
    arguments = {"memory_id": memory_id, "artifact_id": artifact_id, "meta_only": True}
    meta = await _call("recall", "artifact_read", arguments, principal, request)
    if isinstance(meta, JSONResponse):
        return meta
    settings = gateway_state(request).settings
    ttl = min(body.ttl if body is not None and body.ttl else settings.download_token_ttl, settings.download_token_max_ttl)
    token = tokens.issue(settings.artifact_token_secret, tokens.DownloadGrant(principal.key_id, memory_id, artifact_id), ttl)
    path = f"/api/memories/{memory_id}/artifacts/{artifact_id}/raw?token={token}"
    url = f"{settings.server_base_url.rstrip('/')}{path}" if settings.server_base_url else path
    return DownloadTokenResponse(
        token=token, url=url, expires_in=ttl, content_type=meta["content_type"], filename=meta["filename"], size=meta["size"],
    )


@router.get("/{memory_id}/artifacts/{artifact_id}/raw", summary="Download raw artifact bytes")
async def get_artifact_raw(
    memory_id: str, artifact_id: str, request: Request,
    token: str | None = Query(None, description="A download token from the download-token endpoint"),
) -> Any:
    principal = (
        await _token_principal(request, token, memory_id, artifact_id) if token is not None else (await reader(request)).principal
    )
    if isinstance(principal, JSONResponse):
        return principal
    arguments = {"memory_id": memory_id, "artifact_id": artifact_id, "raw": True}
    result = await _call("recall", "artifact_read", arguments, principal, request)
    if isinstance(result, JSONResponse):
        return result
    data = base64.b64decode(result["content"])
    # Only ASCII letters, digits and a few marks reach the header; the rest becomes "_".
    safe_name = "".join(c if c.isascii() and (c.isalnum() or c in "._- ") else "_" for c in result["filename"]) or "artifact"
    return Response(
        content=data, media_type=result["content_type"],
        headers={
            "Content-Disposition": f'inline; filename="{safe_name}"',
            # Authenticated content: not cached, and a token URL is not leaked in a Referer.
            "Cache-Control": "private, no-store",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
            # The content type is the uploader's: an HTML or SVG artifact opened from a token
            # URL on the gateway's origin (the admin console's) runs nothing and reaches nothing.
            "Content-Security-Policy": "default-src 'none'; sandbox",
        },
    )


async def _token_principal(request: Request, token: str, memory_id: str, artifact_id: str) -> Principal | JSONResponse:
    state = gateway_state(request)
    try:
        grant = tokens.verify(state.settings.artifact_token_secret, token, memory_id, artifact_id)
    except tokens.InvalidDownloadToken as exc:
        return _detail(401, str(exc))
    # The token's tenant as it is now: a key deleted or set inactive since takes its tokens along.
    principal = await state.authenticator.principal_for_key(grant.key_id)
    if principal is None:
        return _detail(401, "download token's key is no longer valid")
    return principal


@router.delete("/{memory_id}/artifacts/{artifact_id}", summary="Delete artifact")
async def delete_artifact(memory_id: str, artifact_id: str, request: Request, who: Writer) -> Any:
    arguments = {"memory_id": memory_id, "artifact_id": artifact_id}
    return await _call("ingest", "artifact_delete", arguments, who.principal, request)
