-- GetProviderSchema answers, cached per provider version (ADR 0006): a refresh against a
-- provider version seen before skips the schema RPC.
CREATE TABLE provider_schemas (
    source            text        NOT NULL,   -- registry.terraform.io/hashicorp/null
    version           text        NOT NULL,   -- 2.1.2
    protocol_version  int         NOT NULL CHECK (protocol_version IN (5, 6)),
    schema            jsonb       NOT NULL,   -- kilolock.schema JSON (terraform providers schema -json shape)
    fetched_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, version)
);
