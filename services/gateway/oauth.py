"""OAuth 2.0 (placeholder until the flow lands)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI


class OAuthService:
    def __init__(self, pool: Any, settings: Any) -> None:
        self.pool = pool
        self.settings = settings


def install_oauth(app: FastAPI) -> None:
    return None
