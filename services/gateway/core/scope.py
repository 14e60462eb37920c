"""What the front door (core/edge.py) learns about a request and hands inward in its ASGI scope."""

PRINCIPAL_SCOPE_KEY = "engram.principal"  # the caller's Principal
TOKEN_SCOPE_KEY = "engram.token"  # noqa: S105 - a scope key name, not a secret
SESSION_SCOPE_KEY = "engram.session"  # the ActiveSession the request names (sessions/)
OPENED_SCOPE_KEY = "engram.session-opened"  # the ActiveSession an initialize opened
INITIALIZE_SCOPE_KEY = "engram.initialize"  # whether a POST body carries an `initialize`
JSON_BODY_SCOPE_KEY = "engram.json-body"  # a POST body parsed once (core/wire.py json_body)
MESSAGE_SCOPE_KEY = "engram.jsonrpc"  # the JSON-RPC message JsonRpcGuard validated (mcp_types)
CALL_AHEAD_SCOPE_KEY = "engram.call-ahead"  # a tools/call recorded in the front door's round trip
