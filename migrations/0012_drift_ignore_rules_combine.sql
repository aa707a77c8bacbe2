-- Drift ignore rules combine (issue 12): an open `changed` record is hidden when every change it
-- has is covered by SOME matching rule, the union of the rules that match its state and address;
-- under 0009 one rule's path had to cover all of them. A change no rule covers keeps the record
-- open drift. A `deleted` record is hidden, as before, only by a matching rule without a path.
--
-- The matching stays in SQL, in the resource_drift view, so kl drift, kl status, the exit codes,
-- `kl drift ignore list` and the API keep reading one answer; `kl refresh --dry-run` asks the
-- same function about the changes it found without committing them.
--
-- A rule with a path covers the changes at or under it when the path is comparable in the two
-- objects and the values there differ. Comparable (kl_drift_path_comparable) is the sense of
-- kilolock.drift.changes, which goes down a path only through two objects or two lists of the
-- same length (by an index): where one side is missing, null, a scalar, or a list of another
-- length, it reports the change there, above the path, and the path does not cover it. The record is hidden when, once every covering rule's path is blanked in both
-- objects (kl_drift_strip), nothing differs. A record whose attributes did not change at all (its
-- status or identity did) has no change a path covers: only a rule without a path hides it.
--
-- resource_drift gains ignore_rule_ids: every rule that hides the record, oldest first (the rules
-- without a path that match it, and the path rules that cover one of its changes); ignore_rule_id
-- and ignore_reason are still the oldest of them.

CREATE FUNCTION kl_drift_path_comparable(prev jsonb, cur jsonb, path text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
SELECT NOT EXISTS (
    SELECT 1 FROM generate_series(0, cardinality(path) - 1) AS n
    WHERE NOT COALESCE(CASE
        WHEN jsonb_typeof(prev #> path[1:n]) = 'object' AND jsonb_typeof(cur #> path[1:n]) = 'object' THEN true
        WHEN jsonb_typeof(prev #> path[1:n]) = 'array' AND jsonb_typeof(cur #> path[1:n]) = 'array'
            THEN jsonb_array_length(prev #> path[1:n]) = jsonb_array_length(cur #> path[1:n]) AND path[n + 1] ~ '^[0-9]+$'
        ELSE false END, false))
$$;

-- DOC with the value at PATH blanked: an object's key removed, a list element set to null (not
-- removed: that would shift the elements a later path names by index). Only for comparable paths.
CREATE FUNCTION kl_drift_strip(doc jsonb, path text[]) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN jsonb_typeof(doc #> path[1:cardinality(path) - 1]) = 'array'
            THEN jsonb_set(doc, path, 'null'::jsonb, false)
            ELSE doc #- path END
$$;

-- The rules that hide a drift of KIND at ADDRESS in state STATE_NAME from PREV to CUR (the
-- baseline's and the current attributes), oldest first; NULL when it stays open drift.
CREATE FUNCTION kl_drift_ignored_by(state_name text, address text, kind text, prev jsonb, cur jsonb) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    rule record;
    matched bigint[] := '{}';
    whole boolean := false;
    p jsonb := prev;
    c jsonb := cur;
BEGIN
    FOR rule IN
        SELECT r.id, r.path_steps FROM drift_ignore_rules r
        WHERE (r.expires_at IS NULL OR r.expires_at > now()) AND state_name ~ r.states_regex AND address ~ r.address_regex
        ORDER BY r.id
    LOOP
        IF rule.path_steps IS NULL THEN
            whole := true;
            matched := matched || rule.id;
        ELSIF kind = 'changed' AND kl_drift_path_comparable(prev, cur, rule.path_steps)
              AND (prev #> rule.path_steps) IS DISTINCT FROM (cur #> rule.path_steps) THEN
            matched := matched || rule.id;
            p := kl_drift_strip(p, rule.path_steps);
            c := kl_drift_strip(c, rule.path_steps);
        END IF;
    END LOOP;
    IF whole OR (kind = 'changed' AND cardinality(matched) > 0 AND p IS NOT DISTINCT FROM c) THEN
        RETURN matched;
    END IF;
    RETURN NULL;
END
$$;

DROP VIEW current_resource_drift;
DROP VIEW resource_drift;

-- As in 0009, with the rules found by kl_drift_ignored_by. The EXISTS keeps records no rule
-- could match (most, and all of them when there are no rules) from calling it.
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
LEFT JOIN LATERAL (
    SELECT CASE WHEN d.resolved_version_id IS NULL AND EXISTS (
                    SELECT 1 FROM drift_ignore_rules r
                    WHERE (r.expires_at IS NULL OR r.expires_at > now()) AND s.name ~ r.states_regex AND d.address ~ r.address_regex)
                THEN kl_drift_ignored_by(s.name, d.address, d.kind, b.attributes, cur.attributes) END AS ids
) ign ON true;

-- Open drift: unresolved and not hidden by rules. kl drift, kl status, the exit codes and the
-- API all count from here.
CREATE VIEW current_resource_drift AS
SELECT state_id, state_name, address, deposed, drift_kind, type, provider, current_attributes, previous_attributes,
       current_sensitive_attributes, previous_sensitive_attributes, detected_serial, detected_version_id, detected_at,
       refresh_run_id, drift_id, first_detected_serial, first_detected_version_id, first_detected_at,
       last_confirmed_serial, open_for, changed_attributes
FROM resource_drift
WHERE resolved_version_id IS NULL AND ignore_rule_id IS NULL;
