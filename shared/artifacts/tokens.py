"""Signed download tokens for raw artifact bytes (reference 004): a JWT (PyJWT, HS256) bound
to one tenant, one memory and one artifact, expiring. The raw endpoint takes it in `?token=`
so a browser can open the URL without an API key header."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jwt

AUDIENCE = "engram-artifact-download"
ALGORITHM = "HS256"
MASTER_SUBJECT = "master"


class InvalidDownloadToken(Exception):
    """Expired, tampered, malformed, or issued for another artifact."""


@dataclass(frozen=True)
class DownloadGrant:
    key_id: str | None  # the tenant that asked for the token (None: the master key)
    memory_id: str
    artifact_id: str


def issue(secret: str, grant: DownloadGrant, ttl_seconds: int, now: float | None = None) -> str:
    issued = int(now if now is not None else time.time())
    claims: dict[str, Any] = {
        "sub": grant.key_id or MASTER_SUBJECT,
        "mid": grant.memory_id,
        "aid": grant.artifact_id,
        "aud": AUDIENCE,
        "iat": issued,
        "exp": issued + ttl_seconds,
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify(secret: str, token: str, memory_id: str, artifact_id: str) -> DownloadGrant:
    """The grant a token carries, if it is genuine, unexpired and for this very artifact."""
    try:
        claims = jwt.decode(
            token, secret, algorithms=[ALGORITHM], audience=AUDIENCE,
            options={"require": ["exp", "iat", "sub", "mid", "aid", "aud"]},
        )
    except jwt.ExpiredSignatureError:
        raise InvalidDownloadToken("download token expired") from None
    except jwt.PyJWTError:
        raise InvalidDownloadToken("invalid download token") from None
    if claims["mid"] != memory_id or claims["aid"] != artifact_id:
        raise InvalidDownloadToken("download token is for another artifact")
    subject = claims["sub"]
    return DownloadGrant(None if subject == MASTER_SUBJECT else str(subject), memory_id, artifact_id)
