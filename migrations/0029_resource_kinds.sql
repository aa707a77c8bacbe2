-- The open lifecycle rows indexed by kind (type, then provider address and mode), in place of the
-- type alone: which kinds exist is then a probe of this index a kind (the inventory's schema hints
-- for --where), where it was a pass over every open row. Led by the type, it serves every filter
-- on the type the old index did.
CREATE INDEX resources_kind_idx ON resources (type, provider, mode) WHERE delete_serial IS NULL;
DROP INDEX resources_type_idx;
