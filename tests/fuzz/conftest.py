"""The fuzz tests use the shared stack and the gateway with /openapi.json on."""

from tests.gateway.conftest import tuned_gateway  # noqa: F401 - a fixture, shared with tests/gateway
