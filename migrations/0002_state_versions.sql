-- Every state version, append-only, and the lifecycle index of resource instances (ADR 0004).

CREATE TABLE state_versions (
    id                 uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    state_id           uuid        NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    serial             bigint      NOT NULL CHECK (serial >= 0),
    lineage            text        NOT NULL,
    terraform_version  text,
    source             text        NOT NULL CHECK (source IN ('apply', 'refresh', 'import')),
    raw_state          jsonb       NOT NULL,
    content_hash       text        NOT NULL,
    -- OpenTofu client-side encrypted state is kept opaque: no lifecycle rows, no refresh.
    encrypted          boolean     NOT NULL DEFAULT false,
    actor              text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (state_id, serial)
);

-- One row per lifecycle of a resource instance object at (state, address, deposed key).
-- A lifecycle is open while delete_serial IS NULL. A changed object closes its row and opens a
-- new one; an unchanged object (same content_hash) writes nothing.
CREATE TABLE resources (
    id                    uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    state_id              uuid        NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    address               text        NOT NULL,
    deposed               text        NOT NULL DEFAULT '',
    mode                  text        NOT NULL CHECK (mode IN ('managed', 'data')),
    type                  text        NOT NULL,
    name                  text        NOT NULL,
    module                text        NOT NULL DEFAULT '',
    index_key             jsonb,
    provider              text        NOT NULL,
    schema_version        bigint      NOT NULL DEFAULT 0,
    status                text,
    attributes            jsonb,
    sensitive_attributes  jsonb       NOT NULL DEFAULT '[]',
    content_hash          text        NOT NULL,
    create_serial         bigint      NOT NULL,
    delete_serial         bigint,
    opened_by_version_id  uuid        NOT NULL REFERENCES state_versions(id) ON DELETE CASCADE,
    closed_by_version_id  uuid                 REFERENCES state_versions(id) ON DELETE CASCADE,
    CHECK (delete_serial IS NULL OR delete_serial >= create_serial)
);

CREATE UNIQUE INDEX resources_open_uq ON resources (state_id, address, deposed) WHERE delete_serial IS NULL;
CREATE INDEX resources_type_idx ON resources (type) WHERE delete_serial IS NULL;
CREATE INDEX resources_opened_by_idx ON resources (opened_by_version_id);
CREATE INDEX resources_closed_by_idx ON resources (closed_by_version_id) WHERE closed_by_version_id IS NOT NULL;
