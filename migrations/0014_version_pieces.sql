-- Versions stored as pieces (issue 13: storage grows with change, not with how often refresh runs).
--
-- A version used to hold a full copy of its document (state_versions.raw_state), so every
-- refresh, even one that found nothing, stored the whole state again. A version written from now
-- on is split (store/versions.py, the one write path) into content-addressed pieces of its own
-- state, each stored once however many versions hold it:
--
-- - version_pieces: jsonb bodies, each of one kind (part of its hash): the document's top level
--   without "resources" ('d'; without "serial" too when it is the row's, head_serial, so a refresh
--   that changed nothing holds the same head piece as the version before); a resource with at
--   most one instance, whole ('r'); a bigger resource without its "instances" ('h'); one instance
--   of a bigger resource ('i').
-- - attributes_of: an instance's "attributes" are not stored twice: a piece whose instance has the
--   attributes of a lifecycle row (resources, the same text) leaves them out and names that row,
--   which holds them. A row's attributes never change once set (_RESHAPE in store/versions.py only
--   fills a NULL), so the piece reads back the same for ever.
-- - version_lists: ordered lists of ids. A bigger resource is [its 'h' piece, its 'i' pieces...];
--   a version's layout lists its resources: a positive item is an 'r' piece, a negative one the
--   negated id of a resource list.
--
-- A refresh that changed 1% of the instances adds their pieces (and lifecycle rows), their
-- resources' lists and one layout; one that changed nothing adds its state_versions row only.
-- Pieces belong to one state (state_id, ON DELETE CASCADE): deleting a state removes them, and two
-- writers of different states never touch the same rows (each write holds its state's row lock).
-- jsonb is canonical, so the document rebuilt from pieces is the very jsonb stored before: its text,
-- `kl state pull` and the backend's GET are byte-identical. Versions written before this migration
-- keep raw_state and are read as before; an encrypted envelope or a document whose resources are
-- not all objects with an "instances" array is stored whole, as before.

CREATE TABLE version_pieces (
    id             bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state_id       uuid    NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    hash           bytea   NOT NULL,  -- sha256 of the kind letter and the whole body's text (attributes included)
    body           jsonb   NOT NULL,
    attributes_of  uuid,              -- resources.id: the lifecycle row holding this instance's attributes
    UNIQUE (state_id, hash)
);

CREATE TABLE version_lists (
    id        bigint    GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state_id  uuid      NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    hash      bytea     NOT NULL,  -- sha256 of a kind letter ('r' resource, 'l' layout) and items::text
    items     bigint[]  NOT NULL,
    UNIQUE (state_id, hash)
);

ALTER TABLE state_versions
    ALTER COLUMN raw_state DROP NOT NULL,
    ADD COLUMN head_piece  bigint REFERENCES version_pieces(id),
    ADD COLUMN head_serial boolean NOT NULL DEFAULT false,
    ADD COLUMN layout      bigint REFERENCES version_lists(id),
    ADD CONSTRAINT state_versions_stored CHECK (raw_state IS NOT NULL OR head_piece IS NOT NULL);

-- A piece's full body: its instance's attributes put back from the lifecycle row that holds them
-- (WHOLE: the piece is a resource, its one instance gets them).
CREATE FUNCTION kl_piece(body jsonb, attributes_of uuid, whole boolean) RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT CASE WHEN attributes_of IS NULL THEN body
            WHEN whole THEN jsonb_set(body, '{instances,0,attributes}', (SELECT r.attributes FROM resources r WHERE r.id = attributes_of))
            ELSE body || jsonb_build_object('attributes', (SELECT r.attributes FROM resources r WHERE r.id = attributes_of)) END
$$;

-- The document of version VID as jsonb, whichever way it is stored: the one definition of how
-- pieces make a document (the streamed pull in store/versions.py reads the same pieces in the same
-- order).
CREATE FUNCTION kl_version_document(vid uuid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT COALESCE(v.raw_state,
    h.body
    || CASE WHEN v.head_serial THEN jsonb_build_object('serial', v.serial) ELSE '{}'::jsonb END
    || CASE WHEN v.layout IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('resources', (
        SELECT COALESCE(jsonb_agg(CASE
                   WHEN r.item > 0 THEN (SELECT kl_piece(p.body, p.attributes_of, true) FROM version_pieces p WHERE p.id = r.item)
                   ELSE (SELECT (SELECT hp.body FROM version_pieces hp WHERE hp.id = rl.items[1])
                                || jsonb_build_object('instances', (
                                       SELECT COALESCE(jsonb_agg(kl_piece(ip.body, ip.attributes_of, false) ORDER BY i.ord), '[]'::jsonb)
                                       FROM unnest(rl.items[2:]) WITH ORDINALITY AS i(pid, ord)
                                       JOIN version_pieces ip ON ip.id = i.pid))
                         FROM version_lists rl WHERE rl.id = -r.item) END
                   ORDER BY r.ord), '[]'::jsonb)
        FROM version_lists l
        CROSS JOIN LATERAL unnest(l.items) WITH ORDINALITY AS r(item, ord)
        WHERE l.id = v.layout)) END)
FROM state_versions v
LEFT JOIN version_pieces h ON h.id = v.head_piece
WHERE v.id = vid
$$;
