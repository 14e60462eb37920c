-- The remember profile (reference 003): `path` "projects/<name>/..." names an owner project;
-- a project exists for a tenant once created (remember with create_project=true). A write
-- to a project that does not exist is refused, so a typo in a path never scatters memories.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS profile_projects (
    id          bigserial PRIMARY KEY,
    -- The owning tenant (its key; NULL for the master key's own), read through scope_clause.
    key_id      text REFERENCES api_keys (id) ON DELETE CASCADE,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS profile_projects_owner_name ON profile_projects (coalesce(key_id, ''), name);
