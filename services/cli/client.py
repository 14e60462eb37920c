"""The admin REST as the CLI sees it: one HTTP client with the master key, errors turned into
the CLI's exit codes (README "Operating Engram")."""

from __future__ import annotations

import enum
from typing import Any

import httpx

ADMIN = "/v1/internal/model/nothing"


class Exit(enum.IntEnum):
    """What a script can tell apart from the exit status alone."""

    OK = 0
    ERROR = 1  # anything else: the server refused the request (4xx), answered 5xx, or sent nonsense
    USAGE = 2  # a bad command line (typer / click's own code) or an argument the server rejected (422)
    AUTH = 3  # no key, a wrong key, or a key that is not the master key (401 / 403)
    NOT_FOUND = 4  # the key, session, run or fragment named does not exist (404)
    UNAVAILABLE = 5  # the server did not answer, or answered 503 (a dependency is down): retry later
    FAILED = 6  # the operation ran and reported failure: a failed run, items an import refused


class CliError(Exception):
    def __init__(self, message: str, code: Exit, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


def _code_for(status: int) -> Exit:
    if status in (401, 403):
        return Exit.AUTH
    if status == 404:
        return Exit.NOT_FOUND
    if status == 422:
        return Exit.USAGE
    if status in (502, 503, 504):
        return Exit.UNAVAILABLE
    return Exit.ERROR


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict):
        detail = body.get("detail", body.get("error", body))
        return detail if isinstance(detail, str) else str(detail)
    return str(body)[:300]


class AdminClient:
    def __init__(self, url: str, key: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.http = httpx.Client(base_url=self.url, timeout=timeout, headers={"Authorization": f"Bearer {key}"} if key else {})

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, admin: bool = True, **kwargs: Any) -> httpx.Response:
        if not self.key:
            raise CliError("no key: pass --key or set ENGRAM_MASTER_KEY", Exit.AUTH)
        try:
            response = self.http.request(method, (ADMIN + path) if admin else path, **kwargs)
        except httpx.TimeoutException:
            raise CliError(f"{self.url} did not answer in time", Exit.UNAVAILABLE) from None
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach {self.url}: {exc.__class__.__name__}", Exit.UNAVAILABLE) from None
        if response.status_code >= 400:
            raise CliError(f"HTTP {response.status_code}: {_detail(response)}", _code_for(response.status_code), response.status_code)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise CliError(f"the server's answer to {path} is not JSON", Exit.ERROR) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.json("GET", path, params={k: v for k, v in params.items() if v is not None})
