-- Lifecycles that ignore metadata, and drift as a durable record (issue 12).
--
-- 1. Lifecycle identity. A lifecycle is the remote object's life in one shape: its content_hash
--    now covers status, attributes and identity only. Sensitivity marks, the provider address
--    (`provider.aws` rewritten to `provider["registry.terraform.io/hashicorp/aws"]`) and the
--    schema version (an upgrade that changes no value; a legacy attributes_flat dropped) are
--    metadata: a write that changes only them updates the open row's columns in place and
--    neither closes nor reopens it (each version's raw_state still keeps them exactly). Existing
--    rows get the hash under the new definition below, computed exactly as
--    kilolock/store/versions.py computes it, so the first write after this upgrade reopens nothing.
--
-- 2. drift_records: one row per drift, written by the one write path (versions.write_version) in
--    the same transaction as the version that found or resolved it. At most one open record per
--    (state, address, deposed key). The rule:
--    - found: a refresh-sourced version closes the open lifecycle at an address (its content
--      changed) and opens another there (kind `changed`) or none (kind `deleted`). With no open
--      record there, a record opens: first detected = that version, baseline = the closed
--      lifecycle (what the last apply or import wrote). With one open, it stays the same record
--      (first detected fixed); kind, current lifecycle and detected_* follow the new finding.
--    - resolved by a refresh (`refresh`) that reads the object back with the baseline's content;
--      by any apply- or import-sourced version (`apply`, `import`: Terraform's own view
--      replaces what refresh saw), or `recreated` when that write holds an object again at the
--      address of a `deleted` record. A resolved record keeps its last finding.
--    Records hold no attribute values (those stay in `resources`), only changed attribute names.
--
-- 3. Backfill: every row the 0006 view showed becomes an open record, except a `deleted` row of a
--    lifecycle that its own closing version reopened (a marks-only change), which 0006 reported
--    as a second deletion. Drift already cleared before this upgrade is not reconstructed.
--
-- 4. current_resource_drift keeps its name and columns (open records only), plus new columns at
--    the end; resource_drift is every record, resolved ones included.

CREATE TABLE drift_records (
    id                         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    state_id                   uuid        NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    address                    text        NOT NULL,
    deposed                    text        NOT NULL DEFAULT '',
    kind                       text        NOT NULL CHECK (kind IN ('changed', 'deleted')),
    baseline_resource_id       uuid        NOT NULL REFERENCES resources(id) ON DELETE CASCADE,
    current_resource_id        uuid                 REFERENCES resources(id) ON DELETE CASCADE,
    changed_attributes         text[],     -- top-level attribute names whose value differs; NULL when deleted
    first_detected_version_id  uuid        NOT NULL REFERENCES state_versions(id) ON DELETE CASCADE,
    first_detected_serial      bigint      NOT NULL,
    first_detected_at          timestamptz NOT NULL,
    detected_version_id        uuid        NOT NULL REFERENCES state_versions(id) ON DELETE CASCADE,
    detected_serial            bigint      NOT NULL,
    detected_at                timestamptz NOT NULL,
    resolved_version_id        uuid                 REFERENCES state_versions(id) ON DELETE CASCADE,
    resolved_serial            bigint,
    resolved_at                timestamptz,
    resolved_how               text        CHECK (resolved_how IN ('apply', 'import', 'refresh', 'recreated')),
    CHECK ((resolved_version_id IS NULL) = (resolved_how IS NULL)),
    CHECK ((kind = 'deleted') = (changed_attributes IS NULL))
);

CREATE UNIQUE INDEX drift_records_open_uq ON drift_records (state_id, address, deposed) WHERE resolved_version_id IS NULL;
CREATE INDEX drift_records_state_idx ON drift_records (state_id, first_detected_serial);
-- The drift views name the refresh run that made a version.
CREATE INDEX refresh_runs_to_version_idx ON refresh_runs (to_version_id) WHERE to_version_id IS NOT NULL;

-- 3. Backfill from what the 0006 view showed (its predicate, minus the double-reported deletion).
INSERT INTO drift_records (state_id, address, deposed, kind, baseline_resource_id, current_resource_id, changed_attributes,
                           first_detected_version_id, first_detected_serial, first_detected_at,
                           detected_version_id, detected_serial, detected_at)
SELECT cur.state_id, cur.address, cur.deposed, 'changed', prev.id, cur.id,
       ARRAY(SELECT k FROM (SELECT jsonb_object_keys(CASE WHEN jsonb_typeof(prev.attributes) = 'object' THEN prev.attributes ELSE '{}' END)
                            UNION SELECT jsonb_object_keys(CASE WHEN jsonb_typeof(cur.attributes) = 'object' THEN cur.attributes ELSE '{}' END)) keys(k)
             WHERE prev.attributes -> k IS DISTINCT FROM cur.attributes -> k ORDER BY k),
       v.id, v.serial, v.created_at, v.id, v.serial, v.created_at
FROM resources cur
JOIN state_versions v ON v.id = cur.opened_by_version_id AND v.source = 'refresh'
JOIN resources prev
  ON prev.state_id = cur.state_id AND prev.address = cur.address AND prev.deposed = cur.deposed
 AND prev.closed_by_version_id = cur.opened_by_version_id
WHERE cur.delete_serial IS NULL
  AND cur.attributes IS DISTINCT FROM prev.attributes
  AND NOT EXISTS (SELECT 1 FROM state_versions later
                  WHERE later.state_id = cur.state_id AND later.source = 'apply' AND later.serial > v.serial)
UNION ALL
SELECT gone.state_id, gone.address, gone.deposed, 'deleted', gone.id, NULL, NULL,
       v.id, v.serial, v.created_at, v.id, v.serial, v.created_at
FROM resources gone
JOIN state_versions v ON v.id = gone.closed_by_version_id AND v.source = 'refresh'
WHERE NOT EXISTS (SELECT 1 FROM resources now_open
                  WHERE now_open.state_id = gone.state_id AND now_open.address = gone.address
                    AND now_open.deposed = gone.deposed AND now_open.delete_serial IS NULL)
  AND NOT EXISTS (SELECT 1 FROM resources reopened
                  WHERE reopened.state_id = gone.state_id AND reopened.address = gone.address
                    AND reopened.deposed = gone.deposed AND reopened.opened_by_version_id = gone.closed_by_version_id)
  AND NOT EXISTS (SELECT 1 FROM state_versions later
                  WHERE later.state_id = gone.state_id AND later.source = 'apply' AND later.serial > v.serial);

-- 1. The new lifecycle identity for existing rows. Only `identity` is not a column: it is read
--    from the row's opening version (every hashed field was equal there, under the old hash too).
--    Two set-based passes, each linear: every row without an identity, then the rows whose object
--    has one, found by a hash join on (opening version, mode, type, name, module, key, deposed).
UPDATE resources r
SET content_hash = encode(sha256(convert_to(jsonb_build_array(to_jsonb(r.status), r.attributes, NULL::jsonb)::text, 'UTF8')), 'hex');

WITH identities AS MATERIALIZED (
    SELECT v.id AS version_id, res.doc ->> 'mode' AS mode, res.doc ->> 'type' AS type, res.doc ->> 'name' AS name,
           COALESCE(res.doc ->> 'module', '') AS module, COALESCE(inst.obj -> 'index_key', 'null'::jsonb) AS index_key,
           COALESCE(inst.obj ->> 'deposed', '') AS deposed, inst.obj -> 'identity' AS identity
    FROM state_versions v,
         jsonb_array_elements(v.raw_state -> 'resources') AS res(doc),
         jsonb_array_elements(res.doc -> 'instances') AS inst(obj)
    WHERE NOT v.encrypted AND inst.obj ? 'identity'
      AND EXISTS (SELECT 1 FROM resources x WHERE x.opened_by_version_id = v.id)
)
UPDATE resources r
SET content_hash = encode(sha256(convert_to(jsonb_build_array(to_jsonb(r.status), r.attributes, i.identity)::text, 'UTF8')), 'hex')
FROM identities i
WHERE i.version_id = r.opened_by_version_id AND i.mode = r.mode AND i.type = r.type AND i.name = r.name
  AND i.module = r.module AND i.index_key = COALESCE(r.index_key, 'null'::jsonb) AND i.deposed = r.deposed;

-- 4. The views.
DROP VIEW current_resource_drift;

CREATE VIEW resource_drift AS
SELECT
    d.state_id,
    s.name                    AS state_name,
    d.address,
    d.deposed,
    d.kind                    AS drift_kind,
    b.type,
    b.provider,
    cur.attributes            AS current_attributes,
    b.attributes              AS previous_attributes,
    cur.sensitive_attributes  AS current_sensitive_attributes,
    b.sensitive_attributes    AS previous_sensitive_attributes,
    d.detected_serial,
    d.detected_version_id,
    d.detected_at,
    (SELECT rr.id FROM refresh_runs rr WHERE rr.to_version_id = d.detected_version_id LIMIT 1) AS refresh_run_id,
    d.id                      AS drift_id,
    d.first_detected_serial,
    d.first_detected_version_id,
    d.first_detected_at,
    -- the latest refresh at which the drift still held
    (SELECT c.serial FROM state_versions c
     WHERE c.state_id = d.state_id AND c.source = 'refresh'
       AND c.serial < COALESCE(d.resolved_serial, 9223372036854775807)
     ORDER BY c.serial DESC LIMIT 1) AS last_confirmed_serial,
    COALESCE(d.resolved_at, now()) - d.first_detected_at AS open_for,
    d.changed_attributes,
    d.resolved_serial,
    d.resolved_version_id,
    d.resolved_at,
    d.resolved_how
FROM drift_records d
JOIN states s ON s.id = d.state_id
JOIN resources b ON b.id = d.baseline_resource_id
LEFT JOIN resources cur ON cur.id = d.current_resource_id;

CREATE VIEW current_resource_drift AS
SELECT state_id, state_name, address, deposed, drift_kind, type, provider, current_attributes, previous_attributes,
       current_sensitive_attributes, previous_sensitive_attributes, detected_serial, detected_version_id, detected_at,
       refresh_run_id, drift_id, first_detected_serial, first_detected_version_id, first_detected_at,
       last_confirmed_serial, open_for, changed_attributes
FROM resource_drift
WHERE resolved_version_id IS NULL;
