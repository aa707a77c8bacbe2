-- The audit row of every refresh attempt, exactly the shape of ADR 0006.
CREATE TABLE refresh_runs (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    state_id        uuid        NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    from_version_id uuid        NOT NULL REFERENCES state_versions(id),
    to_version_id   uuid                 REFERENCES state_versions(id),
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    resources_checked  int,
    resources_changed  int,
    resources_failed   int,
    status          text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled')),
    error_summary   text,
    actor           text,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX refresh_runs_state_idx ON refresh_runs (state_id, started_at DESC);
