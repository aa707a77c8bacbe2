-- Observations beside Terraform's versions: a refresh records what it read without moving the
-- serial that Terraform owns (a saved plan stays applicable, `kl state import` of Terraform's next
-- file is not refused).
--
-- 1. state_versions holds two kinds with one history.
--    - 'terraform': what Terraform/OpenTofu wrote through kl serve, what `kl state import` stored,
--      and what a user accepted (`kl drift accept`, `kl refresh --commit`). They alone carry the
--      serial and lineage that GET serves and that writes, locks and imports are checked against;
--      their serials stay unique per state. Every row before this migration is one, refresh
--      versions included: they stay in the history with their meaning, and GET is unchanged.
--    - 'observation': what a refresh read, based on the Terraform version it started from
--      (base_version_id), carrying that version's serial and lineage, numbered 1, 2, ... per base
--      (observation_number). One that found every object as its base has it stores no document
--      (raw_state and head_piece NULL: its document is its base's), so a confirmation costs one
--      row; one that found a difference stores its document as pieces, sharing all but what
--      differs with its base.
--    - seq orders both kinds, in the order they were written (the serial orders only Terraform's).
--
-- 2. observed_objects: what an observation found different from its base, one row per object
--    (changed, or gone: no object). The lifecycle index (`resources`) stays Terraform's alone:
--    its open rows are what Terraform's current version holds; what the latest observation saw is
--    those rows with its observed objects in their place.
--
-- 3. Drift is the latest observation against the Terraform version it was based on. A drift
--    record's current side is an observed object (current_observed_id) or, for records found
--    before this migration, a lifecycle row (current_resource_id); a record resolved by a user's
--    acceptance says `accepted`.

CREATE SEQUENCE state_versions_seq;

ALTER TABLE state_versions
    ADD COLUMN kind               text    NOT NULL DEFAULT 'terraform' CHECK (kind IN ('terraform', 'observation')),
    ADD COLUMN base_version_id    uuid    REFERENCES state_versions(id) ON DELETE CASCADE,
    ADD COLUMN observation_number integer,
    ADD COLUMN seq                bigint;

UPDATE state_versions v SET seq = o.n
FROM (SELECT id, row_number() OVER (ORDER BY created_at, state_id, serial) AS n FROM state_versions) o
WHERE v.id = o.id;

SELECT setval('state_versions_seq', COALESCE((SELECT max(seq) FROM state_versions), 0) + 1, false);

ALTER TABLE state_versions
    ALTER COLUMN seq SET DEFAULT nextval('state_versions_seq'),
    ALTER COLUMN seq SET NOT NULL,
    DROP CONSTRAINT state_versions_state_id_serial_key,
    DROP CONSTRAINT state_versions_stored,
    ADD CONSTRAINT state_versions_stored CHECK (raw_state IS NOT NULL OR head_piece IS NOT NULL OR kind = 'observation'),
    ADD CONSTRAINT state_versions_observation_base
        CHECK ((kind = 'observation') = (base_version_id IS NOT NULL AND observation_number IS NOT NULL));

ALTER SEQUENCE state_versions_seq OWNED BY state_versions.seq;

CREATE UNIQUE INDEX state_versions_terraform_serial_uq ON state_versions (state_id, serial) WHERE kind = 'terraform';
CREATE UNIQUE INDEX state_versions_observation_uq ON state_versions (base_version_id, observation_number)
    WHERE kind = 'observation';
CREATE INDEX state_versions_seq_idx ON state_versions (state_id, seq);

-- A document-less observation's text is its base's.
CREATE OR REPLACE FUNCTION kl_document_version(vid uuid) RETURNS uuid
LANGUAGE sql STABLE AS $$
SELECT CASE WHEN v.raw_state IS NULL AND v.head_piece IS NULL THEN v.base_version_id ELSE v.id END
FROM state_versions v WHERE v.id = vid
$$;

CREATE TABLE observed_objects (
    id                    uuid    PRIMARY KEY DEFAULT gen_random_uuid(),
    observation_id        uuid    NOT NULL REFERENCES state_versions(id) ON DELETE CASCADE,
    state_id              uuid    NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    address               text    NOT NULL,
    deposed               text    NOT NULL DEFAULT '',
    baseline_resource_id  uuid    NOT NULL REFERENCES resources(id) ON DELETE CASCADE,
    gone                  boolean NOT NULL,
    status                text,
    attributes            jsonb,
    sensitive_attributes  jsonb   NOT NULL DEFAULT '[]',
    content_hash          text,
    CHECK (gone = (content_hash IS NULL)),
    UNIQUE (observation_id, address, deposed)
);

CREATE INDEX observed_objects_baseline_idx ON observed_objects (baseline_resource_id);

ALTER TABLE drift_records
    ADD COLUMN current_observed_id uuid REFERENCES observed_objects(id) ON DELETE CASCADE,
    DROP CONSTRAINT drift_records_resolved_how_check,
    ADD CONSTRAINT drift_records_resolved_how_check
        CHECK (resolved_how IN ('apply', 'import', 'refresh', 'recreated', 'accepted'));

CREATE INDEX drift_records_current_observed_idx ON drift_records (current_observed_id) WHERE current_observed_id IS NOT NULL;

-- As in 0012, with the current side from the observed object when the record has one.
DROP VIEW current_resource_drift;
DROP VIEW resource_drift;

CREATE VIEW resource_drift AS
SELECT
    d.state_id,
    s.name                    AS state_name,
    d.address,
    d.deposed,
    d.kind                    AS drift_kind,
    b.type,
    b.provider,
    CASE WHEN d.current_observed_id IS NOT NULL THEN oc.attributes ELSE cur.attributes END AS current_attributes,
    b.attributes              AS previous_attributes,
    CASE WHEN d.current_observed_id IS NOT NULL THEN oc.sensitive_attributes
         ELSE cur.sensitive_attributes END AS current_sensitive_attributes,
    b.sensitive_attributes    AS previous_sensitive_attributes,
    d.detected_serial,
    d.detected_version_id,
    d.detected_at,
    (SELECT rr.id FROM refresh_runs rr WHERE rr.to_version_id = d.detected_version_id LIMIT 1) AS refresh_run_id,
    d.id                      AS drift_id,
    d.first_detected_serial,
    d.first_detected_version_id,
    d.first_detected_at,
    (SELECT c.serial FROM state_versions c
     WHERE c.state_id = d.state_id AND c.source = 'refresh'
       AND c.serial < COALESCE(d.resolved_serial, 9223372036854775807)
     ORDER BY c.serial DESC LIMIT 1) AS last_confirmed_serial,
    COALESCE(d.resolved_at, now()) - d.first_detected_at AS open_for,
    d.changed_attributes,
    d.resolved_serial,
    d.resolved_version_id,
    d.resolved_at,
    d.resolved_how,
    ign.ids[1]                AS ignore_rule_id,
    (SELECT r.reason FROM drift_ignore_rules r WHERE r.id = ign.ids[1]) AS ignore_reason,
    ign.ids                   AS ignore_rule_ids
FROM drift_records d
JOIN states s ON s.id = d.state_id
JOIN resources b ON b.id = d.baseline_resource_id
LEFT JOIN resources cur ON cur.id = d.current_resource_id
LEFT JOIN observed_objects oc ON oc.id = d.current_observed_id
LEFT JOIN LATERAL (
    SELECT CASE WHEN d.resolved_version_id IS NULL AND EXISTS (
                    SELECT 1 FROM drift_ignore_rules r
                    WHERE (r.expires_at IS NULL OR r.expires_at > now()) AND s.name ~ r.states_regex AND d.address ~ r.address_regex)
                THEN kl_drift_ignored_by(s.name, d.address, d.kind, b.attributes,
                                         CASE WHEN d.current_observed_id IS NOT NULL THEN oc.attributes ELSE cur.attributes END)
           END AS ids
) ign ON true;

CREATE VIEW current_resource_drift AS
SELECT state_id, state_name, address, deposed, drift_kind, type, provider, current_attributes, previous_attributes,
       current_sensitive_attributes, previous_sensitive_attributes, detected_serial, detected_version_id, detected_at,
       refresh_run_id, drift_id, first_detected_serial, first_detected_version_id, first_detected_at,
       last_confirmed_serial, open_for, changed_attributes
FROM resource_drift
WHERE resolved_version_id IS NULL AND ignore_rule_id IS NULL;
