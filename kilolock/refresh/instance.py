"""One instance through a refresh: what was stored, the upgrades it needs, its read, and what the
read makes of it (the update the commit splices in)."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.redact import Redactor
from kilolock.refresh.client import AsyncReader, ReadOutcome, ResourceClient, ResourceError
from kilolock.refresh.options import RefreshOptions
from kilolock.refresh.result import Failure as Failure  # noqa: PLC0414 - run() returns them: its callers know them from here
from kilolock.refresh.result import Result as Result  # noqa: PLC0414
from kilolock.refresh.splice import InstanceUpdate
from kilolock.schema import AttributePath
from kilolock.sensitive import marked_paths, values_at

log = logging.getLogger("kilolock.refresh")

@dataclass
class Entry:
    """One instance of the state through a run: what was stored, what the read made of it."""

    inst: tfstate.Instance
    prior_json: bytes | None = None  # the stored attributes as JSON, when the store has them
    update: InstanceUpdate | None = None
    error: str | None = None
    read: bool = False  # its provider was started and asked: it counts as checked



@dataclass(slots=True)
class _Prior:
    """An instance's prior object, as far as kl gets it without calling the provider."""

    recorded: int  # the schema version in the state
    live: int  # the provider's
    marks: list[AttributePath]
    raw_prior: bytes  # the stored JSON; a flatmap object's first JSON form once upgraded
    canonical_prior: bytes | None  # None: does not fit the live schema (or a flatmap object, until upgraded)
    upgrade: bool  # UpgradeResourceState must give the prior first


def _prior_of(client: ResourceClient, inst: tfstate.Instance, options: RefreshOptions, secrets: Redactor,
              prior_json: bytes | None) -> _Prior:
    schema = client.resource_schema(inst.type)
    recorded, live = inst.schema_version, schema.version
    if recorded > live:
        raise ResourceError(
            f"resource instance managed by a newer provider version (state has schema version {recorded}, "
            f"{client.info.source} {client.info.version} has {live})"
        )
    marks_json = inst.obj.get("sensitive_attributes")
    marks = marked_paths(marks_json) if marks_json else []  # nearly always none: skip the call
    flatmap = inst.flatmap
    if flatmap is not None:
        # The pre-0.12 form: only the provider can turn it into an object, as Terraform has it do.
        # Before it sees them, mask the values under the schema's sensitive top-level attributes.
        sensitive_names = {a.name for a in schema.block.attributes if a.sensitive}
        for key, value in flatmap.items():
            if key.split(".", 1)[0] in sensitive_names:
                secrets.add(value)
        return _Prior(recorded, live, marks, b"", None, upgrade=True)
    raw_prior = prior_json if prior_json is not None else tfstate.dumps_compact(inst.obj.get("attributes", {})).encode()
    _remember_secrets(client, inst.type, raw_prior, marks, secrets)
    canonical_prior = client.canonicalize(inst.type, raw_prior)
    # Upgrade gate: Terraform calls UpgradeResourceState before every read; kl does it when the
    # schema version moved or the stored JSON does not fit the live schema (or when asked to).
    upgrade = options.always_upgrade or live > recorded or canonical_prior is None
    return _Prior(recorded, live, marks, raw_prior, canonical_prior, upgrade)


def _upgraded(client: ResourceClient, inst: tfstate.Instance, p: _Prior, secrets: Redactor) -> bytes:
    """UpgradeResourceState: the prior object as the live schema has it (canonical JSON)."""
    if inst.flatmap is None:
        return client.upgrade_resource_state(inst.type, p.recorded, p.raw_prior)
    p.raw_prior = p.canonical_prior = client.upgrade_flatmap(inst.type, p.recorded, inst.flatmap)
    _remember_secrets(client, inst.type, p.raw_prior, p.marks, secrets)
    return p.raw_prior


def refresh_instance(client: ResourceClient, inst: tfstate.Instance, options: RefreshOptions, secrets: Redactor,
                 prior_json: bytes | None = None) -> InstanceUpdate:
    p = _prior_of(client, inst, options, secrets, prior_json)
    prior = _upgraded(client, inst, p, secrets) if p.upgrade else p.canonical_prior
    assert prior is not None
    identity, identity_version, upgrade_from = _identity_of(client, inst)
    if upgrade_from is not None and identity is not None:
        identity = client.upgrade_resource_identity(inst.type, upgrade_from, identity)
    outcome = client.read_resource(inst.type, prior, tfstate.private_bytes(inst.obj), identity)
    return _update_of(client, inst, p, outcome, identity_version, secrets)


async def refresh_instance_async(client: ResourceClient, reader: AsyncReader, inst: tfstate.Instance, options: RefreshOptions,
                             secrets: Redactor, prior_json: bytes | None = None) -> InstanceUpdate:
    """_refresh_one from the event loop: the read through ``reader``; the upgrades, rare and
    local to the provider, through the blocking client on a thread (they must not stall the loop)."""
    p = _prior_of(client, inst, options, secrets, prior_json)
    prior = await asyncio.to_thread(_upgraded, client, inst, p, secrets) if p.upgrade else p.canonical_prior
    assert prior is not None
    identity, identity_version, upgrade_from = _identity_of(client, inst)
    if upgrade_from is not None and identity is not None:
        identity = await asyncio.to_thread(client.upgrade_resource_identity, inst.type, upgrade_from, identity)
    outcome = await reader.read_resource(inst.type, prior, tfstate.private_bytes(inst.obj), identity)
    return _update_of(client, inst, p, outcome, identity_version, secrets)


def _update_of(client: ResourceClient, inst: tfstate.Instance, p: _Prior, outcome: ReadOutcome,
               identity_version: int | None, secrets: Redactor) -> InstanceUpdate:
    """What a read found, as the splice takes it."""
    if outcome.new_state is None:
        return InstanceUpdate(removed=True, changed=True)
    sensitive = list(outcome.sensitive_paths) + client.sensitive_paths(inst.type, outcome.new_state)
    if sensitive:
        for value in values_at(json.loads(outcome.new_state), sensitive):
            secrets.add_value(value)
    flatmap = inst.flatmap is not None
    changed = not flatmap and outcome.new_state != (p.canonical_prior if p.canonical_prior is not None else p.raw_prior)
    return InstanceUpdate(
        removed=False,
        # A flatmap object's first structured form is its baseline (the lifecycle index keeps it
        # as the same object), so what the read found is compared with nothing before it.
        changed=changed,
        reshaped=flatmap,
        # The splice keeps an unchanged object's stored value; a flatmap one gets its first object form.
        attributes=outcome.new_state if changed or flatmap else b"",
        private=outcome.private,
        identity=outcome.identity,
        identity_schema_version=identity_version if outcome.identity is not None else None,
        schema_version=p.live if p.upgrade else p.recorded,
        sensitive_paths=sensitive,
    )


def _identity_of(client: ResourceClient, inst: tfstate.Instance) -> tuple[bytes | None, int | None, int | None]:
    """The stored identity (JSON), the provider's identity schema version, and the stored identity's
    version when UpgradeResourceIdentity must bring it to the provider's first (else None).

    As Terraform 1.12: a stored identity_schema_version newer than the provider's is an error, an
    older one is upgraded with UpgradeResourceIdentity before the read. Unlike Terraform, an
    instance with no identity stored (a state from before 1.12) is not sent to the upgrade with an
    empty identity, which providers built on terraform-plugin-framework refuse: the read fills it in."""
    stored = inst.obj.get("identity")
    identity = tfstate.dumps_compact(stored).encode() if stored is not None else None
    live = client.identity_schema_version(inst.type)
    if live is None:
        return identity, None, None
    recorded = inst.obj.get("identity_schema_version", 0)
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 0:
        raise ResourceError(f"identity_schema_version {recorded!r} is not a whole number")
    if recorded > live:
        raise ResourceError(
            f"resource instance identity managed by a newer provider version (state has identity schema version "
            f"{recorded}, {client.info.source} {client.info.version} has {live})"
        )
    return identity, live, recorded if recorded < live and identity is not None else None


def _remember_secrets(client: ResourceClient, type_name: str, raw_prior: bytes, marks: list[AttributePath],
                      secrets: Redactor) -> None:
    """Feed the prior object's sensitive values (marked, or sensitive in the live schema) to the
    redactor before the provider sees them: its logs and errors about them then come out masked."""
    try:
        paths = marks + client.sensitive_paths(type_name, raw_prior)
        if paths:
            for value in values_at(json.loads(raw_prior), paths):
                secrets.add_value(value)
    except (KlError, ValueError, TypeError):
        pass  # a prior that does not parse or fit is the read's to report; masking is best effort


