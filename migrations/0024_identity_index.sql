-- The identity index: which remote object each open instance is, across every state, so that a
-- fleet can be listed (`kl resources`) and an object claimed twice found (`kl resources --duplicates`).
--
-- 1. resources and observed_objects keep the object's identity (Terraform >= 1.12's `identity`,
--    or the `new_identity` a refresh read) and its identity_schema_version. The identity is part of
--    the content hash already (store/lifecycles.py), so a lifecycle's identity never changes but
--    for the first one given to an object written without (kept in place, not drift).
--
-- 2. resource_identities: one row per open lifecycle row, as the state's latest observation saw it
--    (store/identities.py keeps it, with the lifecycle index, one statement per write):
--    - a Terraform version (apply, import, accept) sets the rows of its objects from the lifecycle
--      rows, and undoes what observations of older versions had put in place (observed);
--    - an observation of the current version puts what it read in place (observed): an object it
--      found gone stays as a row with gone = true (not open), one it read with another identity or
--      id is keyed by what it read; an object read back as Terraform has it is reset.
--    The key is the identity where the object has one (identity_key: sha256 of the identity schema
--    version and the identity's jsonb text, which is canonical: keys in one order, one spelling),
--    else the `id` attribute (object_id, weak evidence: the same name in two accounts).
--
-- 3. inventory: every open instance as the latest observation saw it, one row each, with its state,
--    provider, identity (or id), status and open drift: what `kl resources` and /api/v1/resources
--    read, and the view to query the fleet with SQL (README: the SQL cookbook).
--
-- 4. resource_duplicate_notices: the objects claimed by more than one open instance that a
--    `resource.duplicate` notification has announced, so each is announced once while it lasts.
--    The check is evaluated by the processes that poll, as refresh.stale is (store/notify.py), at
--    most once a period (notify_channels.duplicates_checked_at) whatever the number of processes.
--
-- Backfill: open rows take their identity from the pieces of the versions that hold them (the
-- piece naming the row through attributes_of, 0014), or from a current version stored whole; the
-- index is then made from every open row.

ALTER TABLE resources
    ADD COLUMN identity jsonb,
    ADD COLUMN identity_schema_version bigint;

ALTER TABLE observed_objects
    ADD COLUMN identity jsonb,
    ADD COLUMN identity_schema_version bigint;

-- Terraform's implied provider for an unqualified type (tfstate.implied_source).
CREATE FUNCTION kl_implied_source(type_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN type_name = 'terraform' THEN 'terraform.io/builtin/terraform'
            ELSE 'registry.terraform.io/hashicorp/' || type_name END
$$;

-- The provider source (HOST/NAMESPACE/TYPE) of a provider address as a state holds it:
-- provider["registry.terraform.io/hashicorp/null"].alias, or the legacy provider.null.alias and
-- provider["registry.terraform.io/-/null"], resolved as Terraform 0.13 did (tfstate.parse_provider).
-- No FROM in the body (nor in the others below): PostgreSQL then inlines the function into the
-- statement, where a call per row cost a write of 10,000 instances 0.5 s.
CREATE FUNCTION kl_provider_source(provider text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN provider LIKE '%provider["registry.terraform.io/-/%'
            THEN kl_implied_source(substring(provider from 'provider\["registry\.terraform\.io/-/([^"]+)"\]'))
            WHEN provider LIKE '%provider["%' THEN substring(provider from 'provider\["([^"]+)"\]')
            ELSE kl_implied_source(COALESCE(substring(provider from 'provider\s*\.\s*([A-Za-z_][A-Za-z0-9_-]*)'), '')) END
$$;

CREATE FUNCTION kl_provider_alias(provider text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT COALESCE(substring(provider from '"\]\.([A-Za-z_][A-Za-z0-9_-]*)$'),
                substring(provider from 'provider\s*\.\s*[A-Za-z_][A-Za-z0-9_-]*\s*\.\s*([A-Za-z_][A-Za-z0-9_-]*)\s*$'),
                '')
$$;

-- The key of an identity: NULL when there is none (no object, or no non-null value in it).
CREATE FUNCTION kl_identity_key(identity jsonb, schema_version bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN jsonb_typeof(identity) = 'object' AND jsonb_strip_nulls(identity) <> '{}'::jsonb
            THEN encode(sha256(convert_to(COALESCE(schema_version, 0)::text || ':' || identity::text, 'UTF8')), 'hex') END
$$;

-- The `id` attribute of an object's attributes, NULL when absent or empty.
CREATE FUNCTION kl_object_id(attributes jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT NULLIF(CASE WHEN jsonb_typeof(attributes -> 'id') IN ('string', 'number') THEN attributes ->> 'id' END, '')
$$;

CREATE TABLE resource_identities (
    resource_id              uuid    PRIMARY KEY REFERENCES resources(id) ON DELETE CASCADE,
    -- No foreign key: the row goes with its lifecycle row, which goes with its state (checking a
    -- second key cost a 10,000-instance write 60 ms).
    state_id                 uuid    NOT NULL,
    mode                     text    NOT NULL,
    type                     text    NOT NULL,
    provider_source          text    NOT NULL,
    provider_alias           text    NOT NULL,
    identity                 jsonb,
    identity_schema_version  bigint,
    identity_key             text,   -- kl_identity_key: the object's identity, when it has one
    object_id                text,   -- kl_object_id: its id attribute
    observed                 boolean NOT NULL DEFAULT false,  -- the values are what the latest observation read
    gone                     boolean NOT NULL DEFAULT false   -- that observation found the object gone: not open
);

CREATE INDEX resource_identities_identity_idx ON resource_identities (provider_source, type, identity_key)
    WHERE identity_key IS NOT NULL AND NOT gone;
CREATE INDEX resource_identities_id_idx ON resource_identities (provider_source, type, object_id)
    WHERE object_id IS NOT NULL AND NOT gone;
CREATE INDEX resource_identities_type_idx ON resource_identities (type) WHERE NOT gone;
CREATE INDEX resource_identities_observed_idx ON resource_identities (state_id) WHERE observed;

-- Backfill, identities first: from the pieces naming an open row ('i': the instance; 'r': a resource
-- with its one instance), then from current versions stored whole (matched by the instance's parts).
UPDATE resources r SET identity = p.identity, identity_schema_version = p.version
FROM (SELECT DISTINCT ON (vp.attributes_of) vp.attributes_of AS id,
             COALESCE(vp.body -> 'identity', vp.body -> 'instances' -> 0 -> 'identity') AS identity,
             COALESCE(vp.body -> 'identity_schema_version', vp.body -> 'instances' -> 0 -> 'identity_schema_version') AS version_json
      FROM version_pieces vp
      WHERE vp.attributes_of IS NOT NULL
        AND (vp.body ? 'identity' OR vp.body -> 'instances' -> 0 ? 'identity')) p0
CROSS JOIN LATERAL (SELECT p0.id, p0.identity,
                           CASE WHEN jsonb_typeof(p0.version_json) = 'number' THEN (p0.version_json)::text::bigint END AS version) p
WHERE r.id = p.id AND r.delete_serial IS NULL;

UPDATE resources r SET identity = x.obj -> 'identity',
       identity_schema_version = CASE WHEN jsonb_typeof(x.obj -> 'identity_schema_version') = 'number'
                                      THEN (x.obj ->> 'identity_schema_version')::bigint END
FROM (
    SELECT v.state_id, COALESCE(res ->> 'module', '') AS module, COALESCE(res ->> 'mode', 'managed') AS mode,
           res ->> 'type' AS type, res ->> 'name' AS name, inst -> 'index_key' AS index_key,
           COALESCE(inst ->> 'deposed', '') AS deposed, inst AS obj
    FROM states s
    CROSS JOIN LATERAL (SELECT x.id, x.state_id, x.raw_state FROM state_versions x
                        WHERE x.state_id = s.id AND x.kind = 'terraform' ORDER BY x.serial DESC LIMIT 1) v,
         jsonb_array_elements(CASE WHEN jsonb_typeof(v.raw_state -> 'resources') = 'array' THEN v.raw_state -> 'resources' ELSE '[]' END) res,
         jsonb_array_elements(CASE WHEN jsonb_typeof(res -> 'instances') = 'array' THEN res -> 'instances' ELSE '[]' END) inst
    WHERE v.raw_state IS NOT NULL AND inst ? 'identity'
) x
WHERE r.state_id = x.state_id AND r.delete_serial IS NULL AND r.identity IS NULL AND r.module = x.module AND r.mode = x.mode
  AND r.type = x.type AND r.name = x.name AND r.index_key IS NOT DISTINCT FROM x.index_key AND r.deposed = x.deposed;

INSERT INTO resource_identities (resource_id, state_id, mode, type, provider_source, provider_alias, identity,
                                 identity_schema_version, identity_key, object_id)
SELECT r.id, r.state_id, r.mode, r.type, kl_provider_source(r.provider), kl_provider_alias(r.provider), r.identity,
       r.identity_schema_version, kl_identity_key(r.identity, r.identity_schema_version), kl_object_id(r.attributes)
FROM resources r WHERE r.delete_serial IS NULL;

-- What the latest observation of each state's current version found different, in place.
UPDATE resource_identities x
SET observed = true, gone = o.gone,
    identity = CASE WHEN o.gone THEN x.identity ELSE o.identity END,
    identity_schema_version = CASE WHEN o.gone THEN x.identity_schema_version ELSE o.identity_schema_version END,
    identity_key = CASE WHEN o.gone THEN x.identity_key ELSE kl_identity_key(o.identity, o.identity_schema_version) END,
    object_id = CASE WHEN o.gone THEN x.object_id ELSE kl_object_id(o.attributes) END
FROM (SELECT DISTINCT ON (state_id) id, state_id, base_version_id FROM state_versions
      WHERE kind = 'observation' ORDER BY state_id, seq DESC) l
JOIN observed_objects o ON o.observation_id = l.id
WHERE x.resource_id = o.baseline_resource_id
  AND l.base_version_id = (SELECT c.id FROM state_versions c WHERE c.state_id = l.state_id AND c.kind = 'terraform'
                           ORDER BY c.serial DESC LIMIT 1);

ANALYZE resource_identities;

-- The attributes are what the latest observation read where it found the object changed (the open
-- drift record's observed object), else Terraform's; drift_kind is the open drift there after
-- ignore rules (current_resource_drift), NULL when none.
CREATE VIEW inventory AS
SELECT s.name AS state_name, x.state_id, r.address, r.deposed, r.mode, r.type, r.name, r.module, r.index_key, r.provider,
       x.provider_source, x.provider_alias, x.object_id AS id, x.identity, x.identity_schema_version, x.identity_key,
       CASE WHEN x.identity_key IS NOT NULL THEN 'identity' WHEN x.object_id IS NOT NULL THEN 'id' END AS evidence,
       COALESCE(r.status, 'ready') AS status,
       CASE WHEN oc.id IS NOT NULL THEN oc.attributes ELSE r.attributes END AS attributes,
       CASE WHEN oc.id IS NOT NULL THEN oc.sensitive_attributes ELSE r.sensitive_attributes END AS sensitive_attributes,
       CASE WHEN d.id IS NOT NULL AND EXISTS (SELECT 1 FROM current_resource_drift c WHERE c.drift_id = d.id)
            THEN d.kind END AS drift_kind,
       x.observed, r.id AS resource_id, r.create_serial
FROM resource_identities x
-- The types are one (the index copies the row's); said, a filter on the type reaches both sides.
JOIN resources r ON r.id = x.resource_id AND r.type = x.type
JOIN states s ON s.id = x.state_id
LEFT JOIN drift_records d ON d.state_id = x.state_id AND d.address = r.address AND d.deposed = r.deposed
                         AND d.resolved_version_id IS NULL
LEFT JOIN observed_objects oc ON oc.id = d.current_observed_id AND NOT oc.gone
-- Implied by the index's rows (open ones only), and said so that a filter on the type uses the
-- open rows' type index (resources_type_idx) instead of reading every lifecycle row.
WHERE NOT x.gone AND r.delete_serial IS NULL;

-- An object claimed twice, as announced: confidence 'certain' (one identity key) or 'likely' (one id
-- and matching provider configurations, key the id). The row goes when the duplicate ends, so a
-- duplicate that comes back is announced again.
CREATE TABLE resource_duplicate_notices (
    provider_source  text        NOT NULL,
    type             text        NOT NULL,
    confidence       text        NOT NULL CHECK (confidence IN ('certain', 'likely')),
    key              text        NOT NULL,
    noticed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider_source, type, confidence, key)
);

ALTER TABLE notify_channels ADD COLUMN duplicates_checked_at timestamptz;

ALTER TABLE notify_events
    DROP CONSTRAINT notify_events_kind_check,
    ADD CONSTRAINT notify_events_kind_check CHECK (kind IN ('drift.new', 'drift.updated', 'drift.resolved', 'refresh.failed',
                                                           'refresh.guarded', 'refresh.stale', 'resource.duplicate'));
