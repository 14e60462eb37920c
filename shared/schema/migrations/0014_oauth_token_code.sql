-- The authorization code each OAuth access token was issued from, so that a code presented
-- a second time revokes what the first exchange issued (RFC 6749 §4.1.2: a replayed code
-- SHOULD revoke the tokens based on it; someone else may have spent it first). Tokens issued
-- before this migration carry no code and are unaffected.
SET search_path = agent_memory, public;

ALTER TABLE oauth_tokens ADD COLUMN IF NOT EXISTS code_hash text;
CREATE INDEX IF NOT EXISTS oauth_tokens_code ON oauth_tokens (code_hash) WHERE code_hash IS NOT NULL;
