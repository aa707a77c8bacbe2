"""Accepting an observation: what the latest refresh read becomes Terraform's next version
(serial+1, under the state lock, as Terraform's `apply -refresh-only` would write it), whole or only
the objects named, so Terraform sees it on its next read. `kl drift accept` is this, in the CLI.

An observation is accepted only while it is based on Terraform's current version (what Terraform
wrote since could otherwise be undone), and only when it found a difference, in an object or in
what is not drift (a legacy provider address in its modern form, a flatmap object in its structured
form): an accept of nothing writes nothing. What ignore rules hide is accepted as observed all the same: the rules hide drift
from reports, not from Terraform's state.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

import kilolock
from kilolock import globs, tfstate
from kilolock.errors import KlError
from kilolock.refresh.lockwait import LockWaitFn, SleepFn, wait_for_lock
from kilolock.store import history, locks, observations, states, versions, writes
from kilolock.store.versions import VersionRow


@dataclass(frozen=True)
class AcceptPlan:
    """What an accept would write: the observation, its base (Terraform's current version) and the
    differences it takes (all of them, or those the address globs matched)."""

    state: str
    state_id: str
    base: VersionRow
    observation: VersionRow
    accepted: list[observations.Difference]
    whole: bool  # every difference the observation found: its document as it is

    @property
    def to_serial(self) -> int:
        return self.base.serial + 1

    @property
    def metadata_only(self) -> bool:
        """The observation's document differs from its base in what is not drift alone (legacy
        provider addresses written in their modern form, flatmap objects in their structured form,
        sensitivity marks, private data): a whole accept writes it; Terraform 1.x needs the first two."""
        return self.whole and not self.accepted and not self.observation.confirms

    @property
    def writes(self) -> bool:
        return bool(self.accepted) or self.metadata_only


def plan(conn: psycopg.Connection, name: str, address_globs: Iterable[str] = ()) -> AcceptPlan:
    """What accepting the latest observation of state NAME would take (the differences whose address
    one of ADDRESS_GLOBS matches; none given: all). KlError when there is nothing it can take."""
    sid = states.state_id(conn, name)
    current = versions.current_version(conn, sid)
    observed = observations.latest(conn, sid)
    if current is None or observed is None:
        raise KlError(f"state {name!r} has no observation to accept: `kl refresh {name}` records one")
    if observed.base_version_id != current.id:
        raise KlError(f"the latest observation of state {name!r}, {observed.label}, is based on v{observed.serial}, but "
                      f"Terraform's current version is v{current.serial}: accepting it could undo what was written "
                      f"since; `kl refresh {name}` observes v{current.serial}, then accept what it finds")
    found = observations.differences(conn, observed.id)
    wanted = list(address_globs)
    if not wanted:
        return AcceptPlan(name, sid, current, observed, found, whole=True)
    patterns = [(g, globs.compile_address_glob(g)) for g in wanted]
    unmatched = [g for g, p in patterns if not any(p.fullmatch(d.address) for d in found)]
    if unmatched:
        what = ", ".join(d.address for d in found[:5]) + (", ..." if len(found) > 5 else "") if found else "nothing"
        raise KlError(f"--address {unmatched[0]!r} matches nothing {observed.label} found different from "
                      f"v{current.serial} (it found: {what}); nothing accepted")
    chosen = [d for d in found if any(p.fullmatch(d.address) for _, p in patterns)]
    return AcceptPlan(name, sid, current, observed, chosen, whole=len(chosen) == len(found))


def accept(conn: psycopg.Connection, accepting: AcceptPlan, actor: str, *, lock_timeout: float = 0.0,
           sleep: SleepFn | None = None, on_lock_wait: LockWaitFn | None = None) -> VersionRow | None:
    """Write ACCEPTING's document as Terraform's next version under the state lock (waiting up to
    LOCK_TIMEOUT seconds for another holder); None when it takes no difference (nothing written)."""
    if not accepting.writes:
        return None
    parser = tfstate.ExactJSON()
    name = accepting.state
    keys = _keys(conn, accepting) if accepting.observation.encrypted else None

    def load(serial: int | None, version_id: str | None) -> Any:
        doc = versions.load_document(conn, name, serial, parser.loads, version_id=version_id)
        if keys is None:
            return doc
        from kilolock import encryption

        return parser.loads(encryption.open_envelope(doc, keys, f"state {name!r}").plaintext)

    doc = load(None, accepting.observation.id)
    if not accepting.whole:
        doc = _with_objects_of(load(accepting.base.serial, None), doc, {(d.address, d.deposed) for d in accepting.accepted})
    doc["serial"] = accepting.to_serial
    state = tfstate.parse_state(doc, origin=f"the accepted {accepting.observation.label} of state {name!r}")
    raw = parser.dumps_compact(doc)
    keys_index = None
    if keys is not None:
        from kilolock import encryption

        plaintext = raw.encode("utf-8")
        index_text, index = encryption.index_text(plaintext, keys, f"state {name!r}",
                                                  functools.partial(history.cached_schemas, conn))
        keys_index = writes.DecryptedIndex(index, index_text, masked=not keys.store_decrypted_attributes)
        sealed = keys.seal(plaintext, accepting.to_serial, accepting.base.lineage)
    info = locks.lock_info("OperationTypeApply", actor, f"kl {kilolock.__version__}",
                           info=f"kl drift accept {accepting.observation.label}")
    try:
        wait_for_lock(lambda: locks.acquire(conn, accepting.state_id, name, info, actor), lock_timeout, sleep=sleep,
                      on_wait=on_lock_wait)
    except locks.StateLocked as exc:
        raise KlError(f"{exc}; nothing accepted") from None
    try:
        keys_accepted = {(d.address, d.deposed) for d in accepting.accepted}
        if keys_index is not None:
            written = writes.store_envelope(conn, name, sealed, tfstate.EnvelopeIds(accepting.to_serial, accepting.base.lineage),
                                            source="refresh", actor=actor, index=keys_index,
                                            expect=(accepting.base.serial, accepting.base.lineage), accepted=keys_accepted)
        else:
            written = writes.accept_observation(conn, name, state, raw, expect_serial=accepting.base.serial,
                                                expect_lineage=accepting.base.lineage, accepted=keys_accepted, actor=actor)
    finally:
        locks.release(conn, accepting.state_id, info["ID"], actor)
    return written.version


def _keys(conn: psycopg.Connection, accepting: AcceptPlan) -> Any:
    """The keys of an OpenTofu-encrypted state (its stored configuration, this process's passphrases)."""
    from kilolock import encryption
    from kilolock.store import settings

    stored = settings.get(conn, accepting.state_id)
    if stored.encryption is None:
        raise KlError(f"state {accepting.state!r} is OpenTofu-encrypted and has no encryption configured: "
                      f"`kl state set {accepting.state} --encryption-config FILE`")
    return encryption.keys_for(dict(stored.encryption), bool(stored.store_decrypted_attributes), f"state {accepting.state!r}")


def _with_objects_of(base: Any, observed: Any, keys: set[tuple[str, str]]) -> Any:
    """BASE (a document) with its objects at KEYS as OBSERVED has them: replaced, or removed where
    the observation found them gone (a resource left without instances is dropped, as Terraform does)."""
    found = {(i.address, i.deposed): i.obj for i in tfstate.parse_state(observed).instances}
    emptied: set[int] = set()
    removed: list[tuple[int, int]] = []
    for inst in tfstate.parse_state(base).instances:
        key = (inst.address, inst.deposed)
        if key not in keys:
            continue
        if key in found:
            base["resources"][inst.resource_index]["instances"][inst.instance_index] = found[key]
        else:
            removed.append((inst.resource_index, inst.instance_index))
    for ri, ii in sorted(removed, reverse=True):
        del base["resources"][ri]["instances"][ii]
        if not base["resources"][ri]["instances"]:
            emptied.add(ri)
    base["resources"] = [r for ri, r in enumerate(base["resources"]) if ri not in emptied]
    return base


def describe(difference: observations.Difference) -> str:
    return f"{difference.address}{f' (deposed {difference.deposed})' if difference.deposed else ''}: " + (
        "deleted" if difference.gone else "changed") + (" (hidden by an ignore rule)" if difference.ignored else "")

