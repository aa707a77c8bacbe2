-- How a state is refreshed, stored with the state so that every host, directory and scheduler
-- refreshes it the same way (`kl state set NAME ...`). NULL = not set: kl refresh's own default.
-- A flag given to `kl refresh` overrides a setting for that run.
CREATE TABLE state_settings (
    state_id              uuid        PRIMARY KEY REFERENCES states(id) ON DELETE CASCADE,
    -- Providers run here: relative paths in resources (a local_file's filename) resolve against
    -- it. An absolute path on the host that runs the refresh.
    workdir               text        CHECK (workdir IS NULL OR workdir LIKE '/%'),
    provider_search_paths text[],
    provider_parallelism  int         CHECK (provider_parallelism IS NULL OR provider_parallelism >= 1),
    actor                 text,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    updated_by            text
);
