-- Whether an observation's observed objects are what it found different from its base: it was
-- recorded while its base was Terraform's current version and no writer held the state's lock. One
-- recorded otherwise (Terraform wrote meanwhile, or an apply held the lock) compared nothing and has
-- no observed objects whatever it read. A refresh that reads again the document the latest
-- observation holds records a row sharing that document and those objects, which only a compared
-- observation may stand for. NULL: a Terraform version, a confirmation, an encrypted observation
-- (sealed afresh each time, never repeated), or one recorded before this column.
ALTER TABLE state_versions ADD COLUMN compared_to_base boolean;
