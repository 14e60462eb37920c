-- The mnemory REST surface (reference 004) on Engram's fragments: what 004's memory model
-- has and a fragment has not, one row per fragment that carries it (README "The mnemory
-- REST API"). What both have lives on the fragment only (importance as its number, pinned as
-- is_anchor, memory_type as its type, agent_id), so an MCP amend and a REST update never
-- disagree; memory_type is kept here only for `context`, which no fragment type says. A
-- fragment stored over MCP has no row and reads as categories [], role user, layer
-- consolidated, no labels. The row goes with its fragment.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS mnemory_memories (
    fragment_id   text PRIMARY KEY REFERENCES fragments (id) ON DELETE CASCADE,
    memory_type   text CHECK (memory_type = 'context'),
    categories    text[] NOT NULL DEFAULT '{}',
    role          text NOT NULL DEFAULT 'user' CHECK (role IN ('user', 'assistant')),
    memory_layer  text NOT NULL DEFAULT 'consolidated' CHECK (memory_layer IN ('raw', 'consolidated')),
    labels        jsonb NOT NULL DEFAULT '{}'::jsonb,
    event_date    timestamptz,
    -- ttl_days: past this the memory is "decayed" (hidden unless include_decayed).
    expires_at    timestamptz,
    -- The /api/remember session it was extracted in (mnemory_session_summaries).
    session_id    text
);

CREATE INDEX IF NOT EXISTS mnemory_memories_categories ON mnemory_memories USING gin (categories);
CREATE INDEX IF NOT EXISTS mnemory_memories_labels ON mnemory_memories USING gin (labels jsonb_path_ops);
CREATE INDEX IF NOT EXISTS mnemory_memories_session ON mnemory_memories (session_id) WHERE session_id IS NOT NULL;
