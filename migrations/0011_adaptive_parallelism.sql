-- Requests in flight per provider process can adapt to the provider (`auto`, kl refresh's default)
-- or be fixed at N: state_settings.provider_parallelism stores either as text ('auto' or digits;
-- NULL: not set). Existing numbers keep their value.
ALTER TABLE state_settings
    DROP CONSTRAINT state_settings_provider_parallelism_check,
    ALTER COLUMN provider_parallelism TYPE text USING provider_parallelism::text,
    ADD CONSTRAINT state_settings_provider_parallelism_check
        CHECK (provider_parallelism IS NULL OR provider_parallelism = 'auto' OR provider_parallelism ~ '^[1-9][0-9]{0,9}$');

-- What each run's provider processes were sent: one object per provider group, {"provider",
-- "alias", "mode" ('auto'|'fixed'), "start", "max", "final", "throttled"}. NULL for runs that
-- opened no provider and for runs before this migration.
ALTER TABLE refresh_runs ADD COLUMN concurrency jsonb
    CHECK (concurrency IS NULL OR jsonb_typeof(concurrency) = 'array');
