"""The ``states`` table: a state's id by name, and the row lock every write and lock change on a
state is serialised on."""
from __future__ import annotations

import psycopg

from kilolock.store.errors import StateNotFound

_STATE_ID = "SELECT id::text FROM states WHERE name = %s"
_ENSURE_STATE = "INSERT INTO states (name) VALUES (%s) ON CONFLICT (name) DO NOTHING"
_LOCK_STATE_ROW = "SELECT id::text FROM states WHERE name = %s FOR UPDATE"
_DELETE_STATE = "DELETE FROM states WHERE id = %s"


def state_id(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute(_STATE_ID, (name,)).fetchone()
    if row is None:
        raise StateNotFound(name)
    return str(row[0])


def state_ids(conn: psycopg.Connection) -> dict[str, str]:
    """Every state's id by name, in name order: what a glob selects from (--states)."""
    return {str(r[0]): str(r[1]) for r in conn.execute("SELECT name, id::text FROM states ORDER BY name")}


def names_within(conn: psycopg.Connection, timeout_s: float) -> list[str]:
    """Every state's name in name order, or the database's error once TIMEOUT_S has passed (this
    connection keeps that statement timeout): for a shell's completion, which must not hang."""
    conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{int(timeout_s * 1000)}ms",))
    return [str(r[0]) for r in conn.execute("SELECT name FROM states ORDER BY name")]


def closest_name(conn: psycopg.Connection, name: str) -> str | None:
    """The stored state name most like NAME, if one is close enough to be a typo of it."""
    import difflib

    names = [r[0] for r in conn.execute("SELECT name FROM states")]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return close[0] if close else None


def no_state_matches(conn: psycopg.Connection, glob: str) -> str:
    """That GLOB (``--states``) matches no state, in one line, naming the stored name closest to it
    when one is close: a glob without wildcards is most often a mistyped name."""
    close = closest_name(conn, glob)
    return f"no state matches {glob!r}" + (f"; did you mean {close!r}?" if close else "") + " (see `kl state list`)"


def lock_state_row(conn: psycopg.Connection, name: str, *, create: bool) -> str | None:
    """Lock the ``states`` row of NAME (created first when ``create``) for the rest of the caller's
    transaction, and return its id; None when there is no such state. Every write and lock change
    on a state is serialised on this row lock."""
    row = conn.execute(_LOCK_STATE_ROW, (name,)).fetchone()
    if row is None and create:  # the first write: made, or found made by a concurrent one
        conn.execute(_ENSURE_STATE, (name,))
        row = conn.execute(_LOCK_STATE_ROW, (name,)).fetchone()
    return str(row[0]) if row else None


def delete_state(conn: psycopg.Connection, sid: str) -> None:
    """The state, its versions, lifecycles, lock and runs (all cascade from the states row)."""
    conn.execute(_DELETE_STATE, (sid,))

