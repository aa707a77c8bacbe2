-- Ignore rules follow the drift paths of session 6 (kilolock.drift.changes with the provider's
-- schema): a path goes through a dynamic value's stored wrapper, and a set element has a path of
-- its own.
--
-- 1. Dynamic values. Terraform stores a dynamic attribute as {"value": V, "type": T}; kl drift
--    shows `dyn.x`, never `dyn["value"]["x"]`. A rule's path steps are the shown ones, so the walk
--    steps into "value" wherever both sides hold a wrapper of the same type (a wrapper whose type
--    changed is shown, and must be covered, whole). A wrapper is recognised as kl drift recognises
--    one without a schema (kl_drift_is_dynamic).
-- 2. Set elements. kl drift compares a set as a set and shows an element added or removed as
--    `member[={"name":"eve"}]`; a rule with that path (path_element: the element, after the set's
--    path_steps) covers the change when the element is in exactly one of the two sets, and is
--    blanked by removing it from both (the rest sorted, so two equal sets compare equal whatever
--    order each was written in). Only a dynamic value's type says whether an array is a set; any
--    other array is taken for one here (kl drift, which has the schema, never shows an element of
--    a list, so such a rule matches nothing it shows... except an element a list gained or lost).
--
-- kl_drift_ignored_by keeps its signature (the views call it) and its rules: a record is hidden
-- when, once every covering rule's change is blanked in both objects, nothing differs.

ALTER TABLE drift_ignore_rules ADD COLUMN path_element jsonb;
ALTER TABLE drift_ignore_rules ADD CONSTRAINT drift_ignore_rules_element_needs_path
    CHECK (path_element IS NULL OR path_steps IS NOT NULL);

CREATE FUNCTION kl_drift_is_dynamic(j jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN jsonb_typeof(j) = 'object' AND j ? 'value' AND j ? 'type'
            THEN (SELECT count(*) FROM jsonb_object_keys(j)) = 2
                 AND CASE jsonb_typeof(j -> 'type')
                         WHEN 'string' THEN j ->> 'type' IN ('string', 'number', 'bool', 'dynamic')
                         WHEN 'array' THEN j -> 'type' ->> 0 IN ('list', 'set', 'map', 'object', 'tuple')
                         ELSE false END
            ELSE false END
$$;

-- Where a rule's path (STEPS, then ELEMENT when it names a set element) finds a change from PREV
-- to CUR that kl drift shows at or under it: the stored (raw) jsonb path of that value, with the
-- wrappers' "value" steps in it; NULL when it finds none. It goes down only through two objects,
-- two lists of one length (by an index) or two wrappers of one type, as kilolock.drift.changes does.
CREATE FUNCTION kl_drift_rule_target(prev jsonb, cur jsonb, steps text[], element jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    raw text[] := '{}';
    p jsonb := prev;
    c jsonb := cur;
    step text;
BEGIN
    FOREACH step IN ARRAY steps LOOP
        IF kl_drift_is_dynamic(p) AND kl_drift_is_dynamic(c) AND p -> 'type' = c -> 'type' THEN
            IF p -> 'type' ->> 0 = 'set' THEN
                RETURN NULL;  -- a set has elements, not positions: only [=...] goes into one
            END IF;
            raw := raw || 'value'::text;
            p := p -> 'value';
            c := c -> 'value';
        END IF;
        IF jsonb_typeof(p) = 'object' AND jsonb_typeof(c) = 'object' THEN
            p := p -> step;
            c := c -> step;
        ELSIF jsonb_typeof(p) = 'array' AND jsonb_typeof(c) = 'array' AND step ~ '^[0-9]{1,9}$'
              AND jsonb_array_length(p) = jsonb_array_length(c) THEN
            p := p -> step::int;
            c := c -> step::int;
        ELSE
            RETURN NULL;
        END IF;
        raw := raw || step;
    END LOOP;
    IF element IS NULL THEN
        RETURN CASE WHEN p IS DISTINCT FROM c THEN raw END;
    END IF;
    IF kl_drift_is_dynamic(p) AND kl_drift_is_dynamic(c) AND p -> 'type' = c -> 'type' THEN
        IF p -> 'type' ->> 0 IS DISTINCT FROM 'set' THEN
            RETURN NULL;  -- a dynamic list or tuple: kl drift shows positions there, not elements
        END IF;
        raw := raw || 'value'::text;
        p := p -> 'value';
        c := c -> 'value';
    END IF;
    IF jsonb_typeof(p) = 'array' AND jsonb_typeof(c) = 'array'
       AND EXISTS (SELECT 1 FROM jsonb_array_elements(p) e WHERE e = element)
           <> EXISTS (SELECT 1 FROM jsonb_array_elements(c) e WHERE e = element) THEN
        RETURN raw;
    END IF;
    RETURN NULL;
END
$$;

-- DOC with ELEMENT removed from the set at RAW, the rest sorted.
CREATE FUNCTION kl_drift_strip_element(doc jsonb, raw text[], element jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN jsonb_typeof(doc #> raw) = 'array'
            THEN jsonb_set(doc, raw, (SELECT COALESCE(jsonb_agg(e ORDER BY e), '[]'::jsonb)
                                      FROM jsonb_array_elements(doc #> raw) AS e WHERE e <> element), false)
            ELSE doc END
$$;

CREATE OR REPLACE FUNCTION kl_drift_ignored_by(state_name text, address text, kind text, prev jsonb, cur jsonb) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    rule record;
    matched bigint[] := '{}';
    whole boolean := false;
    p jsonb := prev;
    c jsonb := cur;
    raw text[];
BEGIN
    FOR rule IN
        SELECT r.id, r.path_steps, r.path_element FROM drift_ignore_rules r
        WHERE (r.expires_at IS NULL OR r.expires_at > now()) AND state_name ~ r.states_regex AND address ~ r.address_regex
        ORDER BY r.id
    LOOP
        IF rule.path_steps IS NULL THEN
            whole := true;
            matched := matched || rule.id;
        ELSIF kind = 'changed' THEN
            raw := kl_drift_rule_target(prev, cur, rule.path_steps, rule.path_element);
            IF raw IS NOT NULL THEN
                matched := matched || rule.id;
                IF rule.path_element IS NULL THEN
                    p := kl_drift_strip(p, raw);
                    c := kl_drift_strip(c, raw);
                ELSE
                    p := kl_drift_strip_element(p, raw, rule.path_element);
                    c := kl_drift_strip_element(c, raw, rule.path_element);
                END IF;
            END IF;
        END IF;
    END LOOP;
    IF whole OR (kind = 'changed' AND cardinality(matched) > 0 AND p IS NOT DISTINCT FROM c) THEN
        RETURN matched;
    END IF;
    RETURN NULL;
END
$$;
