"""What a session is in the store: its keys, and a client id resolved to its document."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from services.gateway.sessions.store import Document

Transport = Literal["streamable-http", "sse"]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def doc_key(handle: str) -> str:
    return f"gw:session:{handle}"


def id_key(client_id: str) -> str:
    return f"gw:session-id:{client_id}"


def activity_key(handle: str) -> str:
    return f"gw:session-activity:{handle}"


def token_key(digest: str) -> str:
    return f"gw:session-token:{digest}"


@dataclass(frozen=True)
class ActiveSession:
    """A client id resolved to its logical session, as the store held it at that moment."""

    client_id: str  # the id the request presented
    transport_id: str  # the client connection that id belongs to (a rotate adds ids to it)
    retired: bool  # an id a rotate replaced: it works only with the session's credential
    doc: Document

    @property
    def handle(self) -> str:
        return str(self.doc["handle"])

    @property
    def session_id(self) -> str:
        return str(self.doc["session_id"])

    @property
    def transport(self) -> Transport:
        return "sse" if self.doc["transport"] == "sse" else "streamable-http"

    @property
    def key_id(self) -> str | None:
        key_id = self.doc.get("key_id")
        return str(key_id) if key_id is not None else None

    @property
    def token_digest(self) -> str | None:
        digest = self.doc.get("token_digest")
        return str(digest) if digest is not None else None

    @property
    def mode(self) -> str | None:
        mode = self.doc.get("mode")
        return str(mode) if mode is not None else None

    @property
    def current_client_id(self) -> str:
        """The id this connection's client was given last (a rotate issues a new one)."""
        return str(self.doc["clients"].get(self.transport_id, self.transport_id))

    def segment_id(self, segmented: bool) -> str:
        return segment_of(self.doc, segmented)

    @property
    def owner(self) -> str | None:
        owner = self.doc.get("owner")
        return str(owner) if owner is not None else None


def segment_of(doc: Document, segmented: bool) -> str:
    return f"{doc['session_id']}#{doc['seq']}" if segmented else str(doc["session_id"])


class SessionGone(Exception):
    """The session ended while a request of it was in flight."""

    def __init__(self, client_id: str) -> None:
        super().__init__(f"session {client_id} ended")
        self.client_id = client_id
