-- Provider configuration per state (or global when state_id IS NULL) and (source, alias).
-- Values may be references such as {"env": "GH_TOKEN"}, resolved at run time and never stored
-- resolved. pinned_version overrides "highest version found" in provider discovery.
CREATE TABLE provider_configs (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    state_id        uuid        REFERENCES states(id) ON DELETE CASCADE,
    source          text        NOT NULL,
    alias           text        NOT NULL DEFAULT '',
    config          jsonb       NOT NULL DEFAULT '{}',
    pinned_version  text,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- NULL state_id means "every state"; PostgreSQL < 15 has no NULLS NOT DISTINCT, so key on a
-- sentinel uuid instead.
CREATE UNIQUE INDEX provider_configs_key_uq ON provider_configs (
    COALESCE(state_id, '00000000-0000-0000-0000-000000000000'::uuid), source, alias
);
