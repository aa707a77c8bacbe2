-- Fleet-wide provider limits (issue 13): `kl provider limit SOURCE [--alias A] --max-in-flight N`
-- caps the provider calls in flight at once across every kl process that shares the database
-- (workers and manual refreshes on all hosts): an API's rate limit belongs to a cloud account.
--
-- Processes lease slots in batches (kilolock.refresh.slots): a row per (process, provider) says how
-- many slots it holds until expires_at. A grant locks the limit row (FOR UPDATE), sums the other
-- unexpired leases and never hands out more than max_in_flight in all. A process stops starting
-- calls on its own clock before its lease runs out, so a dead or cut-off holder's slots come back
-- after at most one lease time without anyone having to notice it died.

CREATE TABLE provider_limits (
    source        text        NOT NULL CHECK (source <> ''),
    alias         text        NOT NULL DEFAULT '',
    max_in_flight int         NOT NULL CHECK (max_in_flight >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text,
    PRIMARY KEY (source, alias)
);

CREATE TABLE provider_slot_leases (
    source      text        NOT NULL,
    alias       text        NOT NULL,
    holder      text        NOT NULL,            -- host:pid:random, one per process
    slots       int         NOT NULL CHECK (slots >= 0),
    wanted      int         NOT NULL CHECK (wanted >= 0),  -- calls in flight + waiting: how starved it is
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (source, alias, holder),
    FOREIGN KEY (source, alias) REFERENCES provider_limits (source, alias) ON DELETE CASCADE
);
