-- Discovery (`kl discover SOURCE --type TYPE`): what a provider lists of a resource type
-- (ListResource, plugin protocol 5.10/6.10), matched against the identity index of every state.
--
-- 1. discovery_runs: the audit row of each attempt, as refresh_runs is for refresh. A run's scope
--    is the provider (source, alias, and the state whose provider config it used, if any), the
--    type and the list block's configuration (kept, and hashed so that runs of one scope are
--    found by an index). The counts are those of the objects it stored.
-- 2. discovered_objects: every object a run listed, with what matched it: `managed` (one open
--    instance claims it), `unmanaged` (none), `managed twice` (more than one, in one state or
--    several); claims holds [{state, address, deposed}]. `is_new` marks an unmanaged object that the
--    previous succeeded run of the same scope did not list as unmanaged: only those notify.
-- 3. notify_events takes `resource.unmanaged`, an event of a discovery run: it names no state
--    unless the run used a state's provider config (and keeps `resource.duplicate`, which 0024
--    added).

CREATE TABLE discovery_runs (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    source         text        NOT NULL,
    alias          text        NOT NULL DEFAULT '',
    state_id       uuid                 REFERENCES states(id) ON DELETE CASCADE,
    type           text        NOT NULL,
    list_config    jsonb       NOT NULL,
    config_hash    text        NOT NULL,
    list_limit     int         CHECK (list_limit IS NULL OR list_limit > 0),
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    status         text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled')),
    listed         int,
    managed        int,
    unmanaged      int,
    managed_twice  int,
    new_unmanaged  int,
    error          text,
    actor          text
);

CREATE INDEX discovery_runs_scope_idx ON discovery_runs (source, alias, type, config_hash, started_at DESC);
CREATE INDEX discovery_runs_started_idx ON discovery_runs (started_at DESC);

CREATE TABLE discovered_objects (
    run_id        uuid    NOT NULL REFERENCES discovery_runs(id) ON DELETE CASCADE,
    position      int     NOT NULL,
    identity      jsonb   NOT NULL,
    display_name  text    NOT NULL,
    match         text    NOT NULL CHECK (match IN ('managed', 'unmanaged', 'managed twice')),
    claims        jsonb   NOT NULL DEFAULT '[]',
    is_new        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, position)
);

CREATE INDEX discovered_objects_unmanaged_idx ON discovered_objects (run_id) WHERE match = 'unmanaged';

ALTER TABLE notify_events
    ALTER COLUMN state_id DROP NOT NULL,
    ALTER COLUMN state_name DROP NOT NULL,
    ADD COLUMN discovery_run_id uuid REFERENCES discovery_runs(id) ON DELETE CASCADE,
    DROP CONSTRAINT notify_events_kind_check,
    ADD CONSTRAINT notify_events_kind_check CHECK (kind IN ('drift.new', 'drift.updated', 'drift.resolved',
        'refresh.failed', 'refresh.guarded', 'refresh.stale', 'resource.duplicate', 'resource.unmanaged')),
    ADD CONSTRAINT notify_events_state_or_discovery CHECK (state_id IS NOT NULL OR kind = 'resource.unmanaged');
