"""Providers started before the state is read: a small refresh's launch off its critical path.

A refresh learns which providers it needs only from the state, in the database, so it used to
import psycopg, connect, read the state and only then start each provider and wait for its
handshake and AutoMTLS (together about as long as all the imports). Most runs of a state need the
same binaries as its last run, so kl remembers them per state in a small local file and, at the
start of the next ``kl refresh STATE``, starts those (provider.launch.EarlyLaunch) while it imports
and reads. The factory takes one only when discovery picks that very binary for the same working
directory; one nobody takes is closed at the end of the run. The file is a cache, never a source of
truth (as tlsmemo): missing, corrupt or stale entries cost only the early start.

The file is keyed by a hash of the database URL (never the URL: it may hold a password) and the
state name, and lists each binary's path, size and mtime (a new build is not started early) and
the directory it ran in (kilolock.provider.cachefile). Nothing here imports psycopg or grpc.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Any

from kilolock.errors import KlError
from kilolock.provider import cachefile
from kilolock.provider.launch import EarlyLaunch
from kilolock.redact import Redactor

log = logging.getLogger("kilolock.refresh.prelaunch")

FILE_NAME = "refresh-providers.json"  # under ~/.cache/kilolock (cachefile.path)
_FORMAT = 1
_MAX_STATES = 512


def _key(state: str) -> str:
    where = os.environ.get("KL_DATABASE_URL") or "embedded"
    return hashlib.sha256(f"{where}\0{state}".encode()).hexdigest()


def _load() -> dict[str, Any]:
    return cachefile.read(FILE_NAME, _FORMAT, "states")


def _stat(binary: str) -> dict[str, int] | None:
    try:
        st = os.stat(binary)
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _effective_cwd(cwd: str | None) -> str:
    return cwd if cwd is not None else os.getcwd()


class Prelaunched:
    """The providers one run started early, until the factory takes them or the run ends."""

    def __init__(self, state: str, remembered: list[tuple[str, str]], launches: list[EarlyLaunch]) -> None:
        self._state = state
        self._remembered = remembered
        self._waiting = launches
        self._lock = threading.Lock()

    def take(self, binary: str, cwd: str | None) -> EarlyLaunch | None:
        """The early start of BINARY in CWD, if there is one (each is taken once)."""
        where = _effective_cwd(cwd)
        with self._lock:
            for i, early in enumerate(self._waiting):
                if early.binary == binary and early.cwd == where:
                    return self._waiting.pop(i)
        return None

    def finish(self, used: list[tuple[str, str | None]]) -> None:
        """Close what nobody took, and remember USED (binary, cwd) for the next run of this state."""
        with self._lock:
            unused, self._waiting = self._waiting, []
        for early in unused:
            log.info("provider %s was started early but not used by this run; closing it", early.binary)
            early.discard()
        now = sorted({(b, _effective_cwd(c)) for b, c in used})
        # A run that opened none (no such state, no database, every provider failing) says
        # nothing about what the next run needs: the memory stays as it was.
        if now and now != sorted(self._remembered):
            _remember(self._state, now)


def start(state: str, secrets: Redactor) -> Prelaunched:
    """Start the providers STATE's last run used (those whose binary is unchanged since)."""
    entry = _load().get(_key(state))
    remembered: list[tuple[str, str]] = []
    launches: list[EarlyLaunch] = []
    for item in entry.get("providers", []) if isinstance(entry, dict) else []:
        if not (isinstance(item, dict) and isinstance(item.get("binary"), str) and isinstance(item.get("cwd"), str)):
            continue
        binary, cwd = item["binary"], item["cwd"]
        remembered.append((binary, cwd))
        if _stat(binary) != {"size": item.get("size"), "mtime_ns": item.get("mtime_ns")} or not os.path.isdir(cwd):
            continue
        try:
            launches.append(EarlyLaunch(binary, secrets=secrets, cwd=cwd))
        except (KlError, OSError) as exc:  # the factory's own launch reports it, if it is needed at all
            log.debug("early start of %s failed: %s", binary, exc)
    return Prelaunched(state, remembered, launches)


def _remember(state: str, used: list[tuple[str, str]]) -> None:
    states = _load()
    providers = []
    for binary, cwd in used:
        st = _stat(binary)
        if st is not None:
            providers.append({"binary": binary, "cwd": cwd, **st})
    states.pop(_key(state), None)
    states[_key(state)] = {"providers": providers}  # last written last: the oldest go first below
    while len(states) > _MAX_STATES:
        states.pop(next(iter(states)))
    cachefile.write(FILE_NAME, _FORMAT, "states", states)  # a read-only home: providers start once known, as before
