-- Discovery run by the fleet's workers (`kl schedule set --discover SOURCE --type TYPE ...`).
--
-- 1. fleet_schedules gets a kind: 'refresh' (the states states_glob matches, as before) or
--    'discover' (one discovery scope, kept in `discovery`: {source, alias, state, type,
--    list_config, limit}; no states glob).
-- 2. fleet_jobs gets the same kind. A discover job names no state: it carries its scope (so a
--    schedule removed while its job runs does not take the scope from under it) and the discovery
--    run it is (discovery_run_id, linked as the run begins: a worker that dies mid-listing leaves
--    a run that the take-over of its expired lease finishes as failed). At most one pending
--    discover job per schedule, as there is at most one pending refresh job per state.
ALTER TABLE fleet_schedules
    ADD COLUMN kind text NOT NULL DEFAULT 'refresh' CHECK (kind IN ('refresh', 'discover')),
    ADD COLUMN discovery jsonb,
    ALTER COLUMN states_glob DROP NOT NULL,
    ALTER COLUMN states_regex DROP NOT NULL,
    ADD CONSTRAINT fleet_schedules_kind_fields CHECK (CASE kind
        WHEN 'refresh' THEN states_glob IS NOT NULL AND states_regex IS NOT NULL AND discovery IS NULL
        ELSE states_glob IS NULL AND states_regex IS NULL AND jsonb_typeof(discovery) = 'object' END);

ALTER TABLE fleet_jobs
    ADD COLUMN kind text NOT NULL DEFAULT 'refresh' CHECK (kind IN ('refresh', 'discover')),
    ADD COLUMN discovery jsonb,
    ADD COLUMN discovery_run_id uuid REFERENCES discovery_runs(id) ON DELETE SET NULL,
    ALTER COLUMN state_id DROP NOT NULL,
    ADD CONSTRAINT fleet_jobs_kind_fields CHECK (CASE kind
        WHEN 'refresh' THEN state_id IS NOT NULL AND discovery IS NULL AND discovery_run_id IS NULL
        ELSE state_id IS NULL AND jsonb_typeof(discovery) = 'object' AND refresh_run_id IS NULL END);

CREATE UNIQUE INDEX fleet_jobs_one_pending_discovery_idx ON fleet_jobs (schedule_id)
    WHERE kind = 'discover' AND status IN ('queued', 'running');
CREATE INDEX fleet_jobs_discovery_run_idx ON fleet_jobs (discovery_run_id) WHERE discovery_run_id IS NOT NULL;
