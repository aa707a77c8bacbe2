-- States, their lock, and the audit trail of lock operations.
-- UUID keys everywhere (gen_random_uuid() is built in from PostgreSQL 13).

CREATE TABLE states (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text        NOT NULL UNIQUE
        CHECK (name <> '' AND length(name) <= 255 AND name !~ '[[:cntrl:]]'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- At most one lock per state: the row exists while the state is locked.
-- `info` is Terraform's LockInfo JSON as the client sent it (capitalised keys).
CREATE TABLE state_locks (
    state_id    uuid        PRIMARY KEY REFERENCES states(id) ON DELETE CASCADE,
    lock_id     text        NOT NULL,
    operation   text,
    who         text,
    info        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE lock_events (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    state_id    uuid        NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    event       text        NOT NULL CHECK (event IN ('lock', 'unlock', 'force_unlock')),
    lock_id     text,
    who         text,
    actor       text,
    info        jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lock_events_state_idx ON lock_events (state_id, created_at);
