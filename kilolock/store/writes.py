"""Every way a version enters the database, one operation each: a whole document (kl state import,
an apply through kl serve), an OpenTofu-encrypted envelope, a commit of what a refresh changed (its
delta, for `kl refresh --commit` and an accepted observation) or of a document whose resources did
not change at all, and a refresh's observation, which Terraform never reads.

Each is one transaction: the version row, its lifecycle rows (store/lifecycles.py), its pieces
(store/pieces.py) and the drift records it finds or resolves (store/drift_records.py), with the
serial and lineage rules checked under the row lock on the state (store/states.py).
"""
from __future__ import annotations

import codecs
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.adapt import Dumper

from kilolock import tfstate
from kilolock.store import drift_records, identities, lifecycles, locks, observations, pieces, states, versions
from kilolock.store.errors import VersionConflict
from kilolock.store.versions import VERSION_COLS, VersionRow

log = logging.getLogger("kilolock.store.writes")

SOURCES = ("import", "apply", "refresh")


class SerialBehind(VersionConflict):
    """A write whose serial does not advance the state's: the writer's copy is behind what kl holds.

    ``newer`` are the versions kl holds from the writer's serial on (oldest first, a few at most):
    what was written since, and by what (a refresh, most often, when an old Terraform file is
    imported again). ``known`` is the serial of the version kl holds with the same content, when
    the writer's copy is one kl already has."""

    def __init__(self, name: str, held: VersionRow, new_serial: int, newer: list[VersionRow], known: int | None) -> None:
        super().__init__(
            f"state {name!r} is at serial {held.serial}; the new state has serial {new_serial}, which does not advance it "
            "(a write must have a higher serial unless it is byte-identical to the current version)"
        )
        self.name, self.held, self.new_serial, self.newer, self.known = name, held, new_serial, newer, known


@dataclass(frozen=True)
class WriteResult:
    """What writing a state version did."""

    state_id: str
    version: VersionRow
    created: bool  # False: an idempotent retry of the current version, nothing written
    opened: int = 0
    closed: int = 0
    unchanged: int = 0  # lifecycles kept, including those whose metadata alone was updated
    metadata_updated: int = 0  # open rows whose marks, provider address, schema version or flatmap form changed in place


def store_document(conn: psycopg.Connection, name: str, state: tfstate.State, raw: bytes | str, *, source: str,
                   actor: str | None, force: bool = False, origin: str = "state") -> WriteResult:
    """Store ``raw`` (already parsed into ``state``) as the next version of state ``name``, every
    object of it indexed. ``force`` accepts a new lineage; ``origin`` names the input in error
    messages. ``raw`` as a str is the version's UTF-8, sent a slice at a time: neither its bytes nor
    libpq's copy of a parameter are ever held whole."""
    new_hash = _checked_hash(raw, source, origin)
    with conn.transaction():
        sid, cur = _lock_current(conn, name, None)
        if cur is not None and _check_advance(conn, sid, name, cur, state, new_hash, force):
            return WriteResult(state_id=sid, version=cur, created=False)
        return _store(conn, sid, state, raw, new_hash, source=source, actor=actor, origin=origin, touched=None)


@dataclass(frozen=True)
class DecryptedIndex:
    """What kl indexes of an encrypted envelope it decrypted: the document it may keep in the
    lifecycle index (its sensitive values masked unless the state opted in: the caller's choice)
    and that document's instance index. The envelope alone is stored as the version."""

    state: tfstate.State
    text: bytes
    masked: bool = True


def store_envelope(conn: psycopg.Connection, name: str, raw: bytes, ids: tfstate.EnvelopeIds | None, *, source: str,
                   actor: str | None, force: bool = False, origin: str = "state", index: DecryptedIndex | None = None,
                   unindexed: str | None = None, expect: tuple[int, str] | None = None,
                   accepted: set[tuple[str, str]] | None = None) -> WriteResult:
    """Store ``raw``, an OpenTofu-encrypted envelope, as the next version of state ``name``, kept
    as it was written. ``ids`` is the serial and lineage it carries in the clear
    (tfstate.envelope_ids), checked by the same rules as a plain state's; an envelope without them
    is numbered after the current version and keeps the lineage kl knew (the serial order of
    versions stays the order of writes). ``index``: its decrypted document, indexed as a plain
    state's would be; without one the version hides its resources and ``unindexed`` says why.
    ``expect``: the (serial, lineage) the current version must still be (a refresh's compare-and-swap);
    ``accepted``: it is an accepted observation (accept_observation)."""
    new_hash = _checked_hash(raw, source, origin)
    with conn.transaction():
        sid, cur = _lock_current(conn, name, expect)
        if ids is not None:
            if cur is not None and _check_advance(conn, sid, name, cur, ids, new_hash, force):
                return WriteResult(state_id=sid, version=cur, created=False)
            serial, lineage = ids.serial, ids.lineage
        else:
            if cur is not None and cur.content_hash == new_hash:
                return WriteResult(state_id=sid, version=cur, created=False)
            serial, lineage = (cur.serial + 1 if cur else 1), (cur.lineage if cur else "")
        with _as_json(origin):
            version = _jsonb_rows(conn).execute(
                _INSERT_ENVELOPE, (sid, serial, lineage, index.state.terraform_version or None if index else None, source,
                                   _JsonbText(raw), new_hash, actor, None if index else unindexed or "OpenTofu-encrypted")
            ).fetchone()
        assert version is not None
        if index is None:
            drift_records.record(conn, sid, version.id, version.serial, version.created_at, source)
            return WriteResult(state_id=sid, version=version, created=True)
        _put_document(conn, index.text, origin)
        opened, closed, relabelled = lifecycles.index(conn, sid, version, index.state, None, False, masked=index.masked)
        conn.execute("DROP TABLE kl_descriptors, kl_doc")
        if accepted is not None:  # as in _store
            drift_records.accept(conn, sid, version.id, version.serial, version.created_at, accepted)
        elif source != "refresh" or closed:
            drift_records.record(conn, sid, version.id, version.serial, version.created_at, source)
        return WriteResult(state_id=sid, version=version, created=True, opened=opened, closed=closed,
                           unchanged=len(index.state.instances) - opened, metadata_updated=relabelled)


def commit_delta(conn: psycopg.Connection, name: str, state: tfstate.State, raw: bytes | str, *, expect_serial: int,
                 expect_lineage: str, touched: set[tuple[str, str]] | None, actor: str | None,
                 source: str = "refresh") -> WriteResult:
    """Store ``raw`` (parsed into ``state``) as the next version of state ``name`` if its current
    version is still the one the caller started from (``expect_serial``, ``expect_lineage``): a
    compare-and-swap, VersionConflict otherwise. ``touched`` lists the (address, deposed) objects
    that may differ from that version, removed ones included; the caller guarantees every other
    object is unchanged, so the lifecycle index looks at the touched ones only and a refresh commit
    costs what drifted, not what exists (None: any object may differ, all are indexed)."""
    return _commit(conn, name, state, raw, (expect_serial, expect_lineage), source=source, actor=actor,
                   touched=touched)


def accept_observation(conn: psycopg.Connection, name: str, state: tfstate.State, raw: bytes | str, *, expect_serial: int,
                       expect_lineage: str, accepted: set[tuple[str, str]], actor: str | None) -> WriteResult:
    """Store ``raw`` (parsed into ``state``): an observation accepted as Terraform's next version
    (kl drift accept), a compare-and-swap on ``expect_serial``/``expect_lineage`` as commit_delta.
    The open drift at the ``accepted`` (address, deposed) objects is resolved as `accepted`; the rest
    stays open, its baseline still what Terraform's version holds."""
    return _commit(conn, name, state, raw, (expect_serial, expect_lineage), source="refresh", actor=actor, touched=None,
                   accepted=accepted)


@dataclass(frozen=True)
class Observation:
    """What recording an observation did."""

    state_id: str
    version: VersionRow  # the observation's row
    on_current: bool  # its base was still Terraform's current version (and not locked by a writer): it is the state's drift
    found: int  # objects it found different from its base
    # The LockInfo of an apply (or any lock but a plan's) held when it was recorded: what the
    # refresh read may be that operation's work before its version is written, so it found no drift.
    locked_by: dict[str, Any] | None = None


_INSERT_SEALED_OBSERVATION = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, raw_state, content_hash, actor, encrypted,
                            kind, base_version_id, observation_number)
VALUES (%s, %s, %s, %s, 'refresh', %s::jsonb, %s, %s, true, 'observation', %s, %s) RETURNING {VERSION_COLS}
"""

_INSERT_CONFIRMATION = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, content_hash, actor, encrypted, kind,
                            base_version_id, observation_number)
SELECT state_id, serial, lineage, terraform_version, 'refresh', content_hash, %s, encrypted, 'observation', id, %s
FROM state_versions WHERE id = %s
RETURNING {VERSION_COLS}
"""


def record_observation(conn: psycopg.Connection, name: str, state: tfstate.State, raw: bytes | str, *, base: VersionRow,
                       touched: set[tuple[str, str]], same_as_base: bool, actor: str | None,
                       sealed: DecryptedIndex | None = None) -> Observation:
    """Record what a refresh read of state ``name``, starting from Terraform's version ``base``, as
    an observation of it: ``raw`` (parsed into ``state``, with the base's serial and lineage), of
    which only the ``touched`` (address, deposed) objects may differ from the base; ``same_as_base``:
    none does and the document is the base's (the caller's word), so the observation stores no
    document, only its row. Terraform's versions, the serial and the lifecycle index are not
    changed. When the base is still Terraform's current version, the objects found different are
    recorded (observed_objects) and are the state's drift; when Terraform wrote a newer version while
    the refresh read, the observation is kept against its old base and finds no drift. Likewise
    when the state is locked for anything but a plan: the refresh began before that lock was taken
    (it refuses to begin under one), so what it read may be an apply's work whose version is still to
    come; the next refresh compares what is there then. ``sealed``:
    ``raw`` is an OpenTofu-encrypted envelope, kept as it is, and this is what kl may index of it."""
    new_hash = _checked_hash(raw, "refresh", "state")
    with conn.transaction():
        sid, cur = _lock_current(conn, name, None)
        # Read after the state's row is locked: a writer holds its lock until its version is
        # written, and no version can be written before this transaction ends, so an apply that
        # changed objects during the reads is seen here either as a newer version or by its lock.
        holder = locks.current(conn, sid)
        locked_by = holder if locks.may_change_objects(holder) else None
        on_current = cur is not None and cur.id == base.id and locked_by is None
        last = observations.latest(conn, sid) if on_current else None
        repeated = None
        if last is not None and last.base_version_id == base.id:
            number = (last.observation_number or 0) + 1
            if not same_as_base and sealed is None and not last.confirms and last.content_hash == new_hash:
                repeated = _repeat_observation(conn, last, number, actor)
        else:
            number = observations.last_number(conn, base.id) + 1
        found = 0
        version: VersionRow | None
        if repeated is not None:
            version, found = repeated
        elif same_as_base:
            version = versions.version_rows(conn).execute(_INSERT_CONFIRMATION, (actor, number, base.id)).fetchone()
            assert version is not None
            if on_current:
                identities.confirmed(conn, sid)
        elif sealed is not None:
            assert isinstance(raw, bytes)
            with _as_json("state"):
                version = _jsonb_rows(conn).execute(_INSERT_SEALED_OBSERVATION, (
                    sid, base.serial, base.lineage, sealed.state.terraform_version or None, _JsonbText(raw), new_hash,
                    actor, base.id, number)).fetchone()
            assert version is not None
            _put_document(conn, sealed.text, "state")
            found = lifecycles.observe(conn, sid, version, sealed.state, touched if on_current else set(), False,
                                       on_current=on_current, masked=sealed.masked)
            conn.execute("DROP TABLE kl_descriptors, kl_doc")
        else:
            _put_document(conn, raw, "state")
            version, pieced, has_resources = pieces.insert_version(
                conn, sid, base.serial, base.lineage, state.terraform_version or None, "refresh", new_hash, actor,
                observation=(base.id, number, on_current))
            # Against a base that is no longer current, the open rows are a newer version's, and
            # under a writer's lock they may be about to be: nothing to compare.
            found = lifecycles.observe(conn, sid, version, state, touched if on_current else set(), pieced,
                                       on_current=on_current)
            if has_resources:
                pieces.store_pieces(conn, sid, version)
            conn.execute("DROP TABLE kl_descriptors, kl_doc" + (", kl_parts" if pieced else ""))
        if on_current:
            drift_records.observe(conn, sid, version.id, version.serial, version.created_at)
        return Observation(state_id=sid, version=version, on_current=on_current, found=found, locked_by=locked_by)


# A read that found what the latest observation of the same version holds (a drift nobody fixed,
# or private data the provider rewrites at every read): a row of its own, so that `kl drift` and
# `kl state versions` say it was seen again, sharing that observation's document (head piece and
# layout) and copying its observed objects in one statement each. The full path would send and
# split the document again through temporary tables: ~60 KiB of catalog WAL at every refresh.
_REPEAT_OBSERVATION = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, head_piece, head_serial, layout,
                            content_hash, actor, encrypted, kind, base_version_id, observation_number, compared_to_base)
SELECT state_id, serial, lineage, terraform_version, 'refresh', head_piece, head_serial, layout, content_hash, %s, false,
       'observation', base_version_id, %s, true
FROM state_versions WHERE id = %s AND compared_to_base AND head_piece IS NOT NULL
RETURNING {VERSION_COLS}
"""
_REPEAT_OBSERVED = """
INSERT INTO observed_objects (observation_id, state_id, address, deposed, baseline_resource_id, gone, status, attributes,
                              sensitive_attributes, content_hash, identity, identity_schema_version)
SELECT %s, state_id, address, deposed, baseline_resource_id, gone, status, attributes, sensitive_attributes,
       content_hash, identity, identity_schema_version
FROM observed_objects WHERE observation_id = %s
"""


def _repeat_observation(conn: psycopg.Connection, last: VersionRow, number: int,
                        actor: str | None) -> tuple[VersionRow, int] | None:
    """Record again what LAST (the state's latest observation, of its current version, holding the
    same document) recorded: the new row and how many objects it found different. The same
    document against the same lifecycle rows finds the same objects. None when LAST cannot stand
    for this read: it compared nothing (an apply held the state's lock), or its document is stored
    whole (copying it would store it again)."""
    version = versions.version_rows(conn).execute(_REPEAT_OBSERVATION, (actor, number, last.id)).fetchone()
    if version is None:
        return None
    found = conn.execute(_REPEAT_OBSERVED, (version.id, last.id)).rowcount
    return version, found


# --- the private core, shared by the operations above ------------------------------------------

_INSERT_ENVELOPE = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, raw_state, content_hash, actor, encrypted,
                            unindexed)
VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, true, %s) RETURNING {VERSION_COLS}
"""

# The document goes to a temporary table (no WAL, dropped at commit) and is split there
# (store/pieces.py). Uncompressed (STORAGE EXTERNAL): the document lives for one transaction, and
# every statement that looks into it reads it whole again; compressing a big one, then
# decompressing it once per statement, cost more than the space it saved. work_mem for this
# transaction only: sorting and hashing a big state's pieces spilled to disk at the default 4 MB.
# JIT off for the write: the planner, blind to what the temporary tables hold, puts the
# statements over them far above jit_above_cost, and compiling them took 35-70 ms of a 10-instance
# refresh commit (on a server with JIT, as Debian's and most builds are) for queries that run in
# well under a millisecond. SET LOCAL: both end with the transaction (a transaction pooler is fine).
_DOC_TABLE = """
SET LOCAL jit = off;
CREATE TEMP TABLE kl_doc (doc jsonb) ON COMMIT DROP;
ALTER TABLE kl_doc ALTER COLUMN doc SET STORAGE EXTERNAL;
SET LOCAL work_mem = '64MB'
"""
_DOC_INSERT = "INSERT INTO kl_doc VALUES (%s::jsonb)"

_NEWER = f"""
SELECT {VERSION_COLS} FROM state_versions WHERE state_id = %s AND serial >= %s AND kind = 'terraform'
ORDER BY serial LIMIT 5
"""


class _JsonbText:
    """A version's bytes, sent to PostgreSQL as jsonb text exactly as they are: a str parameter
    would cost two more full copies of a big state (the decoded str, then psycopg's encoding)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _JsonbTextDumper(Dumper):
    oid = psycopg.adapters.types["jsonb"].oid

    def dump(self, obj: _JsonbText) -> bytes:
        # libpq sends a text parameter as a C string: a NUL byte would cut the document short.
        # psycopg refuses one in a str the same way.
        if b"\x00" in obj.data:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return obj.data


def _jsonb_rows(conn: psycopg.Connection) -> psycopg.Cursor[VersionRow]:
    cur = versions.version_rows(conn)
    cur.adapters.register_dumper(_JsonbText, _JsonbTextDumper)
    return cur


@contextlib.contextmanager
def _as_json(origin: str) -> Iterator[None]:
    """PostgreSQL's refusal of the document it is sent (e.g. \\u0000, which jsonb cannot store), as
    the input's error."""
    try:
        yield
    except psycopg.errors.DataError as exc:
        raise tfstate.StateError(f"{origin}: PostgreSQL cannot store it as JSON: {str(exc).strip().splitlines()[0]}") from None


def _is_utf8(raw: bytes) -> bool:
    """Whether RAW is UTF-8, checked a chunk at a time (no decoded copy of the whole document)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(raw)
    try:
        for start in range(0, len(view), versions.UTF8_CHUNK):
            decoder.decode(view[start:start + versions.UTF8_CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _checked_hash(raw: bytes | str, source: str, origin: str) -> str:
    """The content hash of RAW, once it is known to be UTF-8 text and SOURCE one kl records."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    try:
        new_hash = versions.content_hash(raw)
    except UnicodeEncodeError:
        raise tfstate.StateError(f"{origin}: not UTF-8 text (a lone surrogate)") from None
    if isinstance(raw, bytes) and not _is_utf8(raw):
        raise tfstate.StateError(f"{origin}: not UTF-8 text")
    return new_hash


def _lock_current(conn: psycopg.Connection, name: str, expect: tuple[int, str] | None) -> tuple[str, VersionRow | None]:
    """Lock state NAME's row (made first if new) and read its current version, which must be the
    EXPECT (serial, lineage) when given: nothing else may write the state until the transaction ends."""
    sid = states.lock_state_row(conn, name, create=True)
    assert sid is not None  # created above, and deletes wait for the row lock we hold
    cur = versions.current_version(conn, sid)
    if expect is not None and (cur is None or (cur.serial, cur.lineage) != expect):
        now = f"serial {cur.serial}, lineage {cur.lineage}" if cur else "no version"
        raise VersionConflict(
            f"state {name!r} changed while this run was in progress (started from serial {expect[0]}, now {now}); nothing was written"
        )
    return sid, cur


def _check_advance(conn: psycopg.Connection, sid: str, name: str, cur: VersionRow, new: tfstate.State | tfstate.EnvelopeIds,
                   new_hash: str, force: bool) -> bool:
    """The serial and lineage rules. True: the write is a retry of the current version."""
    if new_hash == cur.content_hash:
        return True
    # A version kl numbered itself (an encrypted one from before kl read their lineage) has none.
    if new.lineage != cur.lineage and (cur.lineage or not cur.encrypted) and not force:
        raise VersionConflict(
            f"state {name!r} has lineage {cur.lineage}, the new state has {new.lineage}: "
            "it is a different state; use --force to replace it anyway"
        )
    if new.serial <= cur.serial:
        newer = versions.version_rows(conn).execute(_NEWER, (sid, new.serial)).fetchall()
        known = next((v.serial for v in newer if v.serial == new.serial and v.content_hash == new_hash), None)
        raise SerialBehind(name, cur, new.serial, newer, known)
    return False


def _commit(conn: psycopg.Connection, name: str, state: tfstate.State, raw: bytes | str, expect: tuple[int, str], *,
            source: str, actor: str | None, touched: set[tuple[str, str]] | None,
            accepted: set[tuple[str, str]] | None = None) -> WriteResult:
    """commit_delta, or accept_observation when ACCEPTED."""
    new_hash = _checked_hash(raw, source, "state")
    with conn.transaction():
        sid, cur = _lock_current(conn, name, expect)
        assert cur is not None  # the compare-and-swap found it
        if _check_advance(conn, sid, name, cur, state, new_hash, False):
            return WriteResult(state_id=sid, version=cur, created=False)
        return _store(conn, sid, state, raw, new_hash, source=source, actor=actor, origin="state", touched=touched,
                      accepted=accepted)


# COPY's text format: a backslash starts an escape, and a newline, carriage return or tab would
# end the row or the field. JSON text holds the last three only escaped, but a caller's need not.
_COPY_ESCAPES = ((b"\\", b"\\\\"), (b"\n", b"\\n"), (b"\r", b"\\r"), (b"\t", b"\\t"))


def _copy_text(chunk: bytes) -> bytes:
    for plain, escaped in _COPY_ESCAPES:
        if plain in chunk:
            chunk = chunk.replace(plain, escaped)
    return chunk


def _put_document(conn: psycopg.Connection, raw: bytes | str, origin: str) -> None:
    """RAW in the transaction's temporary table kl_doc, where the index and the pieces read it; a
    str is sent as UTF-8 a slice at a time (COPY), never whole."""
    rows = _jsonb_rows(conn)
    with _as_json(origin):
        rows.execute(_DOC_TABLE)
        if isinstance(raw, str):
            with rows.copy("COPY kl_doc (doc) FROM STDIN") as copy:
                for chunk in versions.utf8_chunks(raw):
                    copy.write(_copy_text(chunk))
        else:
            rows.execute(_DOC_INSERT, (_JsonbText(raw),))


def _store(conn: psycopg.Connection, sid: str, state: tfstate.State, raw: bytes | str, new_hash: str, *, source: str,
           actor: str | None, origin: str, touched: set[tuple[str, str]] | None,
           accepted: set[tuple[str, str]] | None = None) -> WriteResult:
    """The document's version row, its lifecycle index (of the TOUCHED objects only, when given)
    and its pieces, inside the caller's transaction, which holds the state's row lock."""
    _put_document(conn, raw, origin)
    version, pieced, has_resources = pieces.insert_version(conn, sid, state.serial, state.lineage,
                                                           state.terraform_version or None, source, new_hash, actor)
    opened, closed, relabelled = lifecycles.index(conn, sid, version, state, touched, pieced)
    if has_resources:
        pieces.store_pieces(conn, sid, version)
    conn.execute("DROP TABLE kl_descriptors, kl_doc" + (", kl_parts" if pieced else ""))
    # A refresh's drift is its closed lifecycles: none closed (most refreshes), nothing to record,
    # and the statement that looks (planned afresh on every connection) is spared.
    if accepted is not None:
        drift_records.accept(conn, sid, version.id, version.serial, version.created_at, accepted)
    elif source != "refresh" or closed:
        drift_records.record(conn, sid, version.id, version.serial, version.created_at, source)
    return WriteResult(state_id=sid, version=version, created=True, opened=opened, closed=closed,
                       unchanged=len(state.instances) - opened, metadata_updated=relabelled)
