-- Gateway: daily call counters per key, OAuth 2.0 clients / codes / tokens, session lineage.
SET search_path = agent_memory, public;

-- seed: api_keys.daily_limit caps tool calls per key per (UTC) day; counted here so every
-- gateway replica sees the same number, with or without Redis.
CREATE TABLE api_key_daily_usage (
    key_id  text NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    day     date NOT NULL,
    calls   integer NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, day)
);

CREATE TABLE oauth_clients (
    client_id      text PRIMARY KEY,
    client_name    text,
    redirect_uris  text[] NOT NULL,
    -- Registered with an API key's Bearer: that key's tenant is restored at /authorize.
    key_id         text REFERENCES api_keys (id) ON DELETE CASCADE,
    metadata       jsonb NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE oauth_codes (
    code_hash       text PRIMARY KEY,
    client_id       text NOT NULL REFERENCES oauth_clients (client_id) ON DELETE CASCADE,
    key_id          text REFERENCES api_keys (id) ON DELETE CASCADE,
    redirect_uri    text NOT NULL,
    code_challenge  text NOT NULL,
    scopes          text[] NOT NULL DEFAULT '{}',
    resource        text,
    expires_at      timestamptz NOT NULL,
    used_at         timestamptz
);

CREATE TABLE oauth_tokens (
    token_hash  text PRIMARY KEY,
    client_id   text NOT NULL REFERENCES oauth_clients (client_id) ON DELETE CASCADE,
    key_id      text REFERENCES api_keys (id) ON DELETE CASCADE,
    scopes      text[] NOT NULL DEFAULT '{}',
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A rotated session id points back at the id it replaced (POST /session/rotate).
ALTER TABLE sessions ADD COLUMN previous_id text;
CREATE INDEX sessions_transport ON sessions (transport_id);
