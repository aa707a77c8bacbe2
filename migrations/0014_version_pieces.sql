-- Versions stored as pieces (issue 13: storage grows with change, not with how often refresh runs).
--
-- A version used to hold a full copy of its document (state_versions.raw_state), so every
-- refresh, even one that found nothing, stored the whole state again. A version written from now
-- on is split (store/versions.py, the one write path) into content-addressed pieces of its own
-- state, each stored once however many versions hold it:
--
-- - version_pieces: jsonb bodies: one instance object, one resource without its "instances", or
--   the document's top level without "resources" (and without "serial" when it is the row's own,
--   head_serial: so a refresh that changed nothing holds the same head piece as the version before).
-- - version_lists: ordered lists of ids. A resource is [its head piece, its instance pieces...];
--   a version's layout is the list of its resources' lists. A refresh that changed 1% of the
--   instances adds those instances' pieces, their resources' lists and one layout; one that
--   changed nothing adds its state_versions row only.
--
-- Pieces belong to one state (state_id, ON DELETE CASCADE): deleting a state removes them, and two
-- writers of different states never touch the same rows (each write holds its state's row lock).
-- jsonb is canonical, so the document rebuilt from pieces is the very jsonb stored before: its text,
-- `kl state pull` and the backend's GET are byte-identical. Versions written before this migration
-- keep raw_state and are read as before; an encrypted envelope or a document whose resources are
-- not all objects with an "instances" array is stored whole, as before.

CREATE TABLE version_pieces (
    id        bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state_id  uuid    NOT NULL REFERENCES states(id) ON DELETE CASCADE,
    hash      bytea   NOT NULL,  -- sha256 of body::text
    body      jsonb   NOT NULL,
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

-- The document of version VID as jsonb, whichever way it is stored: the one definition of how
-- pieces make a document (the streamed pull in store/versions.py reads the same pieces in the same
-- order).
CREATE FUNCTION kl_version_document(vid uuid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT COALESCE(v.raw_state,
    h.body
    || CASE WHEN v.head_serial THEN jsonb_build_object('serial', v.serial) ELSE '{}'::jsonb END
    || CASE WHEN v.layout IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('resources', (
        SELECT COALESCE(jsonb_agg(
                   (SELECT rh.body FROM version_pieces rh WHERE rh.id = rl.items[1])
                   || jsonb_build_object('instances', (
                       SELECT COALESCE(jsonb_agg(ip.body ORDER BY i.ord), '[]'::jsonb)
                       FROM unnest(rl.items[2:]) WITH ORDINALITY AS i(pid, ord)
                       JOIN version_pieces ip ON ip.id = i.pid))
                   ORDER BY r.ord), '[]'::jsonb)
        FROM version_lists l
        CROSS JOIN LATERAL unnest(l.items) WITH ORDINALITY AS r(lid, ord)
        JOIN version_lists rl ON rl.id = r.lid
        WHERE l.id = v.layout)) END)
FROM state_versions v
LEFT JOIN version_pieces h ON h.id = v.head_piece
WHERE v.id = vid
$$;
