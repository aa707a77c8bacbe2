"""Fleet-wide provider limits and the slot leases that enforce them (migration 0016).

A process holding slots of a provider keeps one row in provider_slot_leases; ``sync`` is the only
way that row changes, and it runs with the limit row locked, so two processes never hand out the
same free slot. The caller (kilolock.refresh.slots) decides what it wants; this module decides
what it gets.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row


@dataclass(frozen=True)
class ProviderLimit:
    """A fleet-wide limit of requests in flight to one provider configuration."""

    source: str
    alias: str
    max_in_flight: int
    created_at: datetime
    created_by: str | None


@dataclass(frozen=True)
class LimitUse:
    """A limit with what the fleet holds of it now (kl provider limits)."""

    source: str
    alias: str
    max_in_flight: int
    held: int
    wanted: int
    holders: int
    created_at: datetime
    created_by: str | None


@dataclass(frozen=True)
class SlotHolder:
    """One process's live lease of a limit (kl fleet status): WORKER is the name of the kl worker
    whose process it is, None for another kl process (kl refresh, kl refresh --all)."""

    source: str
    alias: str
    holder: str  # host:pid:random
    worker: str | None
    slots: int
    wanted: int
    expires_at: datetime


_SET = """
INSERT INTO provider_limits (source, alias, max_in_flight, created_by) VALUES (%s, %s, %s, %s)
ON CONFLICT (source, alias) DO UPDATE SET max_in_flight = EXCLUDED.max_in_flight,
    created_by = EXCLUDED.created_by, created_at = now()
"""

_USE = """
SELECT l.source, l.alias, l.max_in_flight,
       coalesce(sum(s.slots) FILTER (WHERE s.expires_at > now()), 0)::int AS held,
       coalesce(sum(s.wanted) FILTER (WHERE s.expires_at > now()), 0)::int AS wanted,
       count(s.holder) FILTER (WHERE s.expires_at > now() AND (s.slots > 0 OR s.wanted > 0))::int AS holders,
       l.created_at, l.created_by
FROM provider_limits l LEFT JOIN provider_slot_leases s ON s.source = l.source AND s.alias = l.alias
GROUP BY l.source, l.alias ORDER BY l.source, l.alias
"""

# A holder is "host:pid:random" (kilolock.refresh.slots): the worker of that host and pid, if any.
_HOLDERS = """
SELECT s.source, s.alias, s.holder,
       (SELECT w.name FROM fleet_workers w
        WHERE w.status <> 'stopped' AND left(s.holder, length(w.host) + length(w.pid::text) + 2) = w.host || ':' || w.pid || ':'
        ORDER BY w.started_at DESC LIMIT 1) AS worker,
       s.slots, s.wanted, s.expires_at
FROM provider_slot_leases s
WHERE s.expires_at > now() AND (s.slots > 0 OR s.wanted > 0)
ORDER BY s.source, s.alias, s.slots DESC, s.holder
"""

_OTHERS = """
SELECT coalesce(sum(slots), 0)::int, count(*) FILTER (WHERE wanted > slots)::int,
       count(*) FILTER (WHERE wanted > 0)::int
FROM provider_slot_leases WHERE source = %s AND alias = %s AND holder <> %s AND expires_at > now()
"""

_UPSERT_LEASE = """
INSERT INTO provider_slot_leases (source, alias, holder, slots, wanted, expires_at)
VALUES (%s, %s, %s, %s, %s, now() + make_interval(secs => %s))
ON CONFLICT (source, alias, holder) DO UPDATE SET slots = EXCLUDED.slots, wanted = EXCLUDED.wanted,
    expires_at = EXCLUDED.expires_at
"""


# Whether any state's current resources use the provider configuration: Terraform writes it as
# provider["SOURCE"] or provider["SOURCE"].ALIAS, behind a module path when one is set.
_IN_USE = """
SELECT EXISTS (SELECT 1 FROM resources WHERE delete_serial IS NULL AND right(provider, length(%(suffix)s)) = %(suffix)s)
"""


def source_in_use(conn: psycopg.Connection, source: str, alias: str) -> bool:
    """Whether a resource of any state's current version is managed through SOURCE (ALIAS): a
    limit for a provider no state uses is most likely a misspelt source."""
    suffix = f'provider["{source}"]' + (f".{alias}" if alias else "")
    row = conn.execute(_IN_USE, {"suffix": suffix}).fetchone()
    return bool(row and row[0])


def set_limit(conn: psycopg.Connection, source: str, alias: str, max_in_flight: int, actor: str | None) -> None:
    with conn.transaction():
        conn.execute(_SET, (source, alias, max_in_flight, actor))


def remove_limit(conn: psycopg.Connection, source: str, alias: str) -> bool:
    with conn.transaction():
        return conn.execute("DELETE FROM provider_limits WHERE source = %s AND alias = %s",
                            (source, alias)).rowcount > 0


def all_limits(conn: psycopg.Connection) -> dict[tuple[str, str], int]:
    """(source, alias) -> max_in_flight: one small query, made once per run (and now and then by a worker)."""
    return {(s, a): n for s, a, n in conn.execute("SELECT source, alias, max_in_flight FROM provider_limits")}


def usage(conn: psycopg.Connection) -> list[LimitUse]:
    return conn.cursor(row_factory=class_row(LimitUse)).execute(_USE).fetchall()


def holders(conn: psycopg.Connection) -> list[SlotHolder]:
    """The live leases, each with the worker that holds it (counted as ``usage`` counts them)."""
    return conn.cursor(row_factory=class_row(SlotHolder)).execute(_HOLDERS).fetchall()


def sync(conn: psycopg.Connection, source: str, alias: str, holder: str, want: int, in_use: int,
         lease_s: float) -> int | None:
    """Set HOLDER's lease of (SOURCE, ALIAS) to what it may have of WANT, for LEASE_S seconds; returns
    the slots granted, or None when the provider has no limit (any more).

    Never more than the limit in all (what other unexpired leases hold is not free); when another
    holder is starved, at most a fair share (limit / holders that want some). The row never holds
    less than IN_USE: calls already sent cannot be taken back, so it covers them until they end,
    while the grant returned (what the holder may have in flight) can be lower."""
    with conn.transaction():
        row = conn.execute("SELECT max_in_flight FROM provider_limits WHERE source = %s AND alias = %s FOR UPDATE",
                           (source, alias)).fetchone()
        if row is None:
            return None
        limit = int(row[0])
        others = conn.execute(_OTHERS, (source, alias, holder)).fetchone()
        assert others is not None
        held_by_others, starved, wanting = (int(v) for v in others)
        grant = min(want, max(0, limit - held_by_others))
        if starved:
            grant = min(grant, max(1, limit // (wanting + 1)))
        conn.execute(_UPSERT_LEASE, (source, alias, holder, max(grant, in_use), want, lease_s))
        # Rows of holders long gone (expired a lease time ago and more) are only clutter.
        conn.execute("DELETE FROM provider_slot_leases WHERE source = %s AND alias = %s"
                     " AND expires_at < now() - make_interval(secs => %s)", (source, alias, lease_s))
        return grant


def release(conn: psycopg.Connection, holder: str) -> None:
    """Give back every slot HOLDER leased (at exit: the others need not wait for the lease to expire)."""
    with conn.transaction():
        conn.execute("DELETE FROM provider_slot_leases WHERE holder = %s", (holder,))
