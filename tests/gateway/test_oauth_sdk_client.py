"""A full OAuth flow driven by the mcp SDK's own OAuth client, no human: discovery from the
401, dynamic registration, PKCE, consent (answered by this test), token, tool call."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import httpx
import httpx2
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from tests.gateway.test_oauth import csrf_field
from tests.support import Stack, create_api_key, payload, unique

REDIRECT = "http://localhost:8976/callback"


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def test_sdk_oauth_client_end_to_end(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    answered: dict[str, str] = {}

    async def redirect_handler(authorization_url: str) -> None:
        # The "user": open the consent page, type the API key into it and allow (the browser
        # posts the page's hidden CSRF token and keeps its cookie), follow nothing further.
        async with httpx.AsyncClient() as browser:
            page = await browser.get(authorization_url)
            assert page.status_code == 200 and 'name="decision"' in page.text
            query = {k: v[0] for k, v in parse_qs(urlparse(authorization_url).query).items()}
            form = {**query, "csrf_token": csrf_field(page), "decision": "allow", "access_key": raw}
            consent = await browser.post(f"{stack.gateway_url}/authorize", data=form)
        assert consent.status_code == 302, consent.text
        back = parse_qs(urlparse(consent.headers["location"]).query)
        answered["code"], answered["state"] = back["code"][0], back["state"][0]

    async def callback_handler() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=answered["code"], state=answered["state"])

    storage = MemoryStorage()
    provider = OAuthClientProvider(
        server_url=stack.mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="sdk-test", redirect_uris=[AnyUrl(REDIRECT)], grant_types=["authorization_code"],
            response_types=["code"], token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    ws = unique()
    async with httpx2.AsyncClient(auth=provider, timeout=60) as http:
        async with streamable_http_client(stack.mcp_url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                stored = payload(await session.call_tool(
                    "remember", {"content": "OAuth clients act as the key that consented.", "topic": "oauth", "type": "fact", "workspace": ws},
                ))
                active = await session.read_resource("memory://active-session")
    assert stored["success"] is True
    assert storage.tokens is not None and storage.tokens.access_token.startswith("oat_")
    assert storage.client is not None and storage.client.client_id.startswith("mmcp_")
    assert f'"keyId": "{key_id}"' in active.contents[0].text
