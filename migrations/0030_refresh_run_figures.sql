-- What /metrics reports of the refresh runs, kept as runs finish instead of counted at each scrape:
-- at 10,000 states two index probes a state for its last runs, and a pass over every run ever
-- finished for the duration histogram (refresh_runs is never pruned), were most of a scrape.
--
-- Both tables are kept per state, by triggers in the transaction that finishes (or removes) a run,
-- and have no foreign key to states on purpose: a refresh's commit holds its state's row FOR
-- UPDATE, a foreign key's check would wait on that row, and recording a run's failure must never
-- wait on a commit whose connection was cut (it could hang until PostgreSQL notices the dead
-- client). Per state, not fleet-wide counters, for the same reason: a run's finish locks only its
-- own state's rows, never a row every other run of the fleet needs. A state's rows go with its runs.

-- The latest finished run by start (what `kl status` shows as the last refresh once nothing runs)
-- and the finish of the newest succeeded one.
CREATE TABLE refresh_run_last (
    state_id   uuid        PRIMARY KEY,
    started_at timestamptz NOT NULL,
    status     text        NOT NULL,
    success_at timestamptz           -- NULL: no run of the state has succeeded
);

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

-- A state's finished runs by outcome and bucket, their durations summed as intervals (exact to the
-- microsecond, so a sum never drifts from a recount's). A row whose runs all went is removed.
CREATE TABLE refresh_run_durations (
    state_id uuid     NOT NULL,
    status   text     NOT NULL,
    bucket   smallint NOT NULL,
    runs     bigint   NOT NULL,
    took     interval NOT NULL,
    PRIMARY KEY (state_id, status, bucket)
);

INSERT INTO refresh_run_durations (state_id, status, bucket, runs, took)
SELECT state_id, status, kl_refresh_duration_bucket(finished_at - started_at), count(*), sum(finished_at - started_at)
FROM refresh_runs WHERE finished_at IS NOT NULL
GROUP BY 1, 2, 3;

-- A state's last-run figures read again from its runs (through refresh_runs' indexes): after a
-- finished run changed or went, where they cannot be derived from the change.
CREATE FUNCTION kl_recount_refresh_run_last(states uuid[]) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM refresh_run_last l WHERE l.state_id = ANY(states)
        AND NOT EXISTS (SELECT FROM refresh_runs x WHERE x.state_id = l.state_id AND x.finished_at IS NOT NULL);
    INSERT INTO refresh_run_last AS l (state_id, started_at, status, success_at)
    SELECT last.state_id, last.started_at, last.status,
           (SELECT x.finished_at FROM refresh_runs x WHERE x.state_id = last.state_id AND x.status = 'succeeded'
            ORDER BY x.finished_at DESC LIMIT 1)
    FROM (SELECT DISTINCT unnest(states)) s(id)
    CROSS JOIN LATERAL (SELECT x.state_id, x.started_at, x.status FROM refresh_runs x
                        WHERE x.state_id = s.id AND x.finished_at IS NOT NULL
                        ORDER BY x.started_at DESC LIMIT 1) last
    ORDER BY 1
    ON CONFLICT (state_id) DO UPDATE SET started_at = excluded.started_at, status = excluded.status,
                                         success_at = excluded.success_at;
$$;

SELECT kl_recount_refresh_run_last(array_agg(id)) FROM states;

-- A run finishing (or written finished): counted in, and its state's last run moved forward when it
-- began later than the one recorded. Both are commutative (an UPDATE that waited on another finish
-- reads the row as that one left it), so two runs of one state finishing at once give the figures a
-- recount gives. An UPDATE first, and the upsert only for a state's first row of its kind: an
-- upsert locks the row before updating it, a WAL record more at every refresh. A finished run
-- changed: its old figures out first.
CREATE FUNCTION kl_count_refresh_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.finished_at IS NOT NULL THEN
        UPDATE refresh_run_durations SET runs = runs - 1, took = took - (OLD.finished_at - OLD.started_at)
        WHERE state_id = OLD.state_id AND status = OLD.status
          AND bucket = kl_refresh_duration_bucket(OLD.finished_at - OLD.started_at);
        DELETE FROM refresh_run_durations WHERE state_id = OLD.state_id AND runs = 0;
    END IF;
    IF NEW.finished_at IS NOT NULL THEN
        UPDATE refresh_run_durations SET runs = runs + 1, took = took + (NEW.finished_at - NEW.started_at)
        WHERE state_id = NEW.state_id AND status = NEW.status
          AND bucket = kl_refresh_duration_bucket(NEW.finished_at - NEW.started_at);
        IF NOT FOUND THEN
            INSERT INTO refresh_run_durations AS d (state_id, status, bucket, runs, took)
            VALUES (NEW.state_id, NEW.status, kl_refresh_duration_bucket(NEW.finished_at - NEW.started_at), 1,
                    NEW.finished_at - NEW.started_at)
            ON CONFLICT (state_id, status, bucket) DO UPDATE SET runs = d.runs + 1, took = d.took + excluded.took;
        END IF;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.finished_at IS NOT NULL THEN
        PERFORM kl_recount_refresh_run_last(ARRAY[OLD.state_id, NEW.state_id]);
    ELSIF NEW.finished_at IS NOT NULL THEN
        UPDATE refresh_run_last l SET
            status = CASE WHEN NEW.started_at >= l.started_at THEN NEW.status ELSE l.status END,
            started_at = greatest(l.started_at, NEW.started_at),
            -- greatest() passes over a NULL
            success_at = greatest(l.success_at, CASE WHEN NEW.status = 'succeeded' THEN NEW.finished_at END)
        WHERE l.state_id = NEW.state_id;
        IF NOT FOUND THEN
            INSERT INTO refresh_run_last AS l (state_id, started_at, status, success_at)
            VALUES (NEW.state_id, NEW.started_at, NEW.status, CASE WHEN NEW.status = 'succeeded' THEN NEW.finished_at END)
            ON CONFLICT (state_id) DO UPDATE SET
                status = CASE WHEN excluded.started_at >= l.started_at THEN excluded.status ELSE l.status END,
                started_at = greatest(l.started_at, excluded.started_at),
                success_at = greatest(l.success_at, excluded.success_at);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- Runs removed (most often with their state): a removed state's figures go whole; otherwise its
-- removed runs are counted out and its last run read again. Per statement: deleting a state with
-- its history is one pass, not one trigger call a run.
CREATE FUNCTION kl_uncount_refresh_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    gone uuid[];
    kept uuid[];
BEGIN
    SELECT array_agg(o.state_id) FILTER (WHERE s.id IS NULL), array_agg(o.state_id) FILTER (WHERE s.id IS NOT NULL)
    INTO gone, kept
    FROM (SELECT DISTINCT state_id FROM old_rows WHERE finished_at IS NOT NULL) o LEFT JOIN states s ON s.id = o.state_id;
    IF gone IS NOT NULL THEN
        DELETE FROM refresh_run_durations WHERE state_id = ANY(gone);
        DELETE FROM refresh_run_last WHERE state_id = ANY(gone);
    END IF;
    IF kept IS NOT NULL THEN
        UPDATE refresh_run_durations d SET runs = d.runs - o.runs, took = d.took - o.took
        FROM (SELECT state_id, status, kl_refresh_duration_bucket(finished_at - started_at) AS bucket, count(*) AS runs,
                     sum(finished_at - started_at) AS took
              FROM old_rows WHERE finished_at IS NOT NULL AND state_id = ANY(kept) GROUP BY 1, 2, 3) o
        WHERE d.state_id = o.state_id AND d.status = o.status AND d.bucket = o.bucket;
        DELETE FROM refresh_run_durations WHERE state_id = ANY(kept) AND runs = 0;
        PERFORM kl_recount_refresh_run_last(kept);
    END IF;
    RETURN NULL;
END
$$;

-- Heartbeats and other updates of a running run fire nothing.
CREATE TRIGGER refresh_runs_counted_in AFTER INSERT ON refresh_runs
    FOR EACH ROW WHEN (NEW.finished_at IS NOT NULL) EXECUTE FUNCTION kl_count_refresh_run();
CREATE TRIGGER refresh_runs_counted_change AFTER UPDATE OF state_id, status, started_at, finished_at ON refresh_runs
    FOR EACH ROW WHEN (OLD.finished_at IS NOT NULL OR NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION kl_count_refresh_run();
CREATE TRIGGER refresh_runs_counted_out AFTER DELETE ON refresh_runs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION kl_uncount_refresh_runs();
