-- A refresh run's liveness without a session (issue 13, PgBouncer in transaction pooling mode).
--
-- A run normally holds a session advisory lock keyed on its id for as long as its connection
-- lives: a `running` row whose lock is free belongs to a dead process (kl runs --stale, a worker's
-- take-over). Behind a transaction pooler no session survives a transaction, so a process told so
-- (kl_pooler=transaction) takes no such lock and beats instead: heartbeat_at is set at begin and
-- renewed every few seconds while the run goes on. A run is alive while its lock is held OR its
-- heartbeat is recent (kilolock.store.refresh_runs.HEARTBEAT_STALE_S); NULL for runs that never beat.
ALTER TABLE refresh_runs ADD COLUMN heartbeat_at timestamptz;
