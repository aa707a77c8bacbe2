-- OpenTofu-encrypted states that kl decrypts with a key configured per state (`kl state set NAME
-- --encryption-config FILE`). The version row keeps the envelope exactly as it was written
-- (encrypted = true); the lifecycle index comes from the decrypted document.
--
-- The configuration is OpenTofu's encryption block in its JSON form, with every passphrase a
-- reference ({"env": "NAME"}) resolved by the process that reads or writes the state: no key
-- material is ever stored. store_decrypted_attributes opts the state in to indexing its sensitive
-- values as they are; by default they are indexed masked.
ALTER TABLE state_settings ADD COLUMN encryption jsonb;
ALTER TABLE state_settings ADD COLUMN store_decrypted_attributes boolean;

-- Why an encrypted version has no lifecycle index (no key configured, a wrong or rotated key):
-- NULL for a version kl indexed, plain or decrypted. A one-line reason that names no secret.
ALTER TABLE state_versions ADD COLUMN unindexed text;
UPDATE state_versions SET unindexed = 'OpenTofu-encrypted, stored before kl could decrypt state' WHERE encrypted;
