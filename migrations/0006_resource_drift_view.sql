-- Drift as a view (ADR 0006, v1.7b), plus the deleted-by-refresh kind (DESIGN.md).
--
-- changed: the open lifecycle at (state, address) was opened by a refresh-sourced version that
--          closed a prior lifecycle at the same address, with different attributes (a refresh that
--          only added sensitivity marks is not drift), and no apply-sourced version came later.
-- deleted: a lifecycle was closed by a refresh-sourced version, nothing was opened at that
--          address by the same version (the object is gone), nothing is open there now, and no
--          apply-sourced version came later.
-- Clause (2) — any later apply clears the drift — holds for both kinds.

CREATE INDEX resources_closed_at_idx ON resources (state_id, address, delete_serial)
    WHERE delete_serial IS NOT NULL;

CREATE VIEW current_resource_drift AS
SELECT
    cur.state_id,
    s.name                   AS state_name,
    cur.address,
    cur.deposed,
    'changed'::text          AS drift_kind,
    cur.type,
    cur.provider,
    cur.attributes           AS current_attributes,
    prev.attributes          AS previous_attributes,
    cur.sensitive_attributes AS current_sensitive_attributes,
    prev.sensitive_attributes AS previous_sensitive_attributes,
    v.serial                 AS detected_serial,
    v.id                     AS detected_version_id,
    v.created_at             AS detected_at,
    (SELECT rr.id FROM refresh_runs rr WHERE rr.to_version_id = v.id LIMIT 1) AS refresh_run_id
FROM resources cur
JOIN state_versions v ON v.id = cur.opened_by_version_id AND v.source = 'refresh'
JOIN resources prev
  ON prev.state_id = cur.state_id
 AND prev.address = cur.address
 AND prev.deposed = cur.deposed
 AND prev.closed_by_version_id = cur.opened_by_version_id
JOIN states s ON s.id = cur.state_id
WHERE cur.delete_serial IS NULL
  AND cur.attributes IS DISTINCT FROM prev.attributes
  AND NOT EXISTS (
      SELECT 1 FROM state_versions later
      WHERE later.state_id = cur.state_id AND later.source = 'apply' AND later.serial > v.serial
  )
UNION ALL
SELECT
    gone.state_id,
    s.name,
    gone.address,
    gone.deposed,
    'deleted'::text,
    gone.type,
    gone.provider,
    NULL::jsonb,
    gone.attributes,
    NULL::jsonb,
    gone.sensitive_attributes,
    v.serial,
    v.id,
    v.created_at,
    (SELECT rr.id FROM refresh_runs rr WHERE rr.to_version_id = v.id LIMIT 1)
FROM resources gone
JOIN state_versions v ON v.id = gone.closed_by_version_id AND v.source = 'refresh'
JOIN states s ON s.id = gone.state_id
WHERE NOT EXISTS (
      SELECT 1 FROM resources now_open
      WHERE now_open.state_id = gone.state_id AND now_open.address = gone.address
        AND now_open.deposed = gone.deposed AND now_open.delete_serial IS NULL
  )
  AND NOT EXISTS (
      SELECT 1 FROM state_versions later
      WHERE later.state_id = gone.state_id AND later.source = 'apply' AND later.serial > v.serial
  );
