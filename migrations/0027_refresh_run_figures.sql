-- What /metrics reports of the refresh runs, kept where a scrape reads it in one pass instead of
-- counting refresh_runs at each scrape: at 10,000 states, two index probes a state for its last
-- runs and a scan of every run ever finished (refresh_runs is never pruned) were most of its time.
--
-- 1. Each state's latest finished run (by start, as `kl status` shows its last refresh) and the
--    finish of its newest succeeded run, on its `states` row.
-- 2. The fleet's duration histogram: runs and summed duration by outcome and bucket, one row each.
--
-- Both are kept by statement triggers on refresh_runs (transition tables, as migration 0023's
-- counts), in the transaction that finishes a run: the figures are those a recount of refresh_runs
-- gives, whichever statement finished the run (kl refresh, the stale-run cleanup, a worker's
-- take-over), and runs leave them when deleted with their state.

ALTER TABLE states
    ADD COLUMN last_refresh_status     text,         -- NULL: no run of the state has finished
    ADD COLUMN last_refresh_success_at timestamptz;  -- NULL: none has succeeded

-- The histogram's bucket of a duration: the first upper bound at or above it (its `le`), the
-- bound's position in kilolock.store.metrics.DURATION_BUCKETS; past the last bound, their count
-- (+Inf only). Changing those bounds takes a migration recounting refresh_run_durations.
CREATE FUNCTION kl_refresh_duration_bucket(took interval) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN took <= interval '0.5 seconds' THEN 0
        WHEN took <= interval '1 seconds' THEN 1
        WHEN took <= interval '2.5 seconds' THEN 2
        WHEN took <= interval '5 seconds' THEN 3
        WHEN took <= interval '10 seconds' THEN 4
        WHEN took <= interval '30 seconds' THEN 5
        WHEN took <= interval '60 seconds' THEN 6
        WHEN took <= interval '120 seconds' THEN 7
        WHEN took <= interval '300 seconds' THEN 8
        WHEN took <= interval '600 seconds' THEN 9
        WHEN took <= interval '1800 seconds' THEN 10
        ELSE 11 END::smallint
$$;

-- Summed as intervals (exact to the microsecond), so the sum never drifts from a recount's.
CREATE TABLE refresh_run_durations (
    status text     NOT NULL,
    bucket smallint NOT NULL,
    runs   bigint   NOT NULL,
    took   interval NOT NULL,
    PRIMARY KEY (status, bucket)
);

INSERT INTO refresh_run_durations (status, bucket, runs, took)
SELECT status, kl_refresh_duration_bucket(finished_at - started_at), count(*), sum(finished_at - started_at)
FROM refresh_runs WHERE finished_at IS NOT NULL
GROUP BY 1, 2;

UPDATE states s SET
    last_refresh_status = (SELECT x.status FROM refresh_runs x WHERE x.state_id = s.id AND x.finished_at IS NOT NULL
                           ORDER BY x.started_at DESC LIMIT 1),
    last_refresh_success_at = (SELECT max(x.finished_at) FROM refresh_runs x
                               WHERE x.state_id = s.id AND x.status = 'succeeded');

-- A run counts while finished: added when inserted or updated finished, taken out when deleted or
-- updated from finished (its old figures out, its new ones in). Running rows (their heartbeats are
-- most updates) touch nothing. The affected states' figures are read again through their indexes
-- rather than derived from the change: a run finished out of order (a take-over ends a run at its
-- last heartbeat) or deleted is then no special case. Rows are written in key order, so two
-- statements finishing runs lock the counters in the same order.
CREATE FUNCTION kl_apply_refresh_runs(state_ids uuid[], statuses text[], took interval[], n int[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO refresh_run_durations AS d (status, bucket, runs, took)
    SELECT c.status, kl_refresh_duration_bucket(c.took), sum(c.n), sum(c.took * c.n)
    FROM unnest(statuses, took, n) c(status, took, n)
    GROUP BY 1, 2
    HAVING sum(c.n) <> 0 OR sum(c.took * c.n) <> interval '0'
    ORDER BY 1, 2
    ON CONFLICT (status, bucket) DO UPDATE SET runs = d.runs + excluded.runs, took = d.took + excluded.took;

    UPDATE states s SET
        last_refresh_status = (SELECT x.status FROM refresh_runs x WHERE x.state_id = s.id AND x.finished_at IS NOT NULL
                               ORDER BY x.started_at DESC LIMIT 1),
        last_refresh_success_at = (SELECT x.finished_at FROM refresh_runs x WHERE x.state_id = s.id AND x.status = 'succeeded'
                                   ORDER BY x.finished_at DESC LIMIT 1)
    WHERE s.id IN (SELECT DISTINCT unnest(state_ids));
$$;

CREATE FUNCTION kl_count_refresh_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM kl_apply_refresh_runs(array_agg(state_id), array_agg(status), array_agg(finished_at - started_at),
                                      array_agg(1))
        FROM new_rows WHERE finished_at IS NOT NULL HAVING count(*) > 0;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM kl_apply_refresh_runs(array_agg(c.state_id), array_agg(c.status), array_agg(c.took), array_agg(c.n))
        FROM (SELECT state_id, status, finished_at - started_at AS took, 1 AS n FROM new_rows WHERE finished_at IS NOT NULL
              UNION ALL
              SELECT state_id, status, finished_at - started_at, -1 FROM old_rows WHERE finished_at IS NOT NULL) c
        HAVING count(*) > 0;
    ELSE
        PERFORM kl_apply_refresh_runs(array_agg(state_id), array_agg(status), array_agg(finished_at - started_at),
                                      array_agg(-1))
        FROM old_rows WHERE finished_at IS NOT NULL HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER refresh_runs_counted_in AFTER INSERT ON refresh_runs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kl_count_refresh_runs();
CREATE TRIGGER refresh_runs_counted_change AFTER UPDATE ON refresh_runs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION kl_count_refresh_runs();
CREATE TRIGGER refresh_runs_counted_out AFTER DELETE ON refresh_runs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kl_count_refresh_runs();
