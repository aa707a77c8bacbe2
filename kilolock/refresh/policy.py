"""Whether a run's reads are recorded: the commit policy in one function, and the guards it
weighs (mass removal, deletions found without a workdir)."""
from __future__ import annotations

import logging
import os

import psycopg

from kilolock.errors import KlError
from kilolock.refresh import whyfailed
from kilolock.refresh.options import RefreshOptions
from kilolock.refresh.result import Failure as Failure  # noqa: PLC0414 - run() returns them: its callers know them from here
from kilolock.refresh.result import Result as Result  # noqa: PLC0414
from kilolock.store import locks

log = logging.getLogger("kilolock.refresh")

from kilolock.refresh.instance import Entry

GroupKey = tuple[str, str]  # (provider source, alias)

def commit_decision(result: Result, options: RefreshOptions, mass_removal: str | None, cancelled: bool,
                    unplaced_removal: str | None = None) -> tuple[bool, str | None]:
    """The commit policy, in one place. Returns (commit, why not)."""
    if cancelled:
        return False, "cancelled"
    if result.failed:
        return False, whyfailed.failed_resources(result, options)
    if mass_removal and not options.allow_mass_removal:
        return False, mass_removal + "; nothing committed (use --allow-mass-removal if this is real)"
    if unplaced_removal:
        return False, unplaced_removal
    if options.dry_run:
        return False, None
    # Zero failures: commit, also when nothing changed: the versions then show when a refresh confirmed the state.
    return True, None


def mass_removal(groups: dict[GroupKey, list[Entry]], options: RefreshOptions) -> str | None:
    for (source, alias), entries in groups.items():
        gone = sum(1 for e in entries if e.update is not None and e.update.removed)
        if gone >= options.mass_removal_min and gone > options.mass_removal_share * len(entries):
            label = source + (f" (alias {alias})" if alias else "")
            return (f"{gone} of {len(entries)} instances of {label} came back deleted, more than "
                    f"{options.mass_removal_share:.0%}: this looks like bad credentials or the wrong account")
    return None


def unplaced_removal(name: str, entries: list[Entry], options: RefreshOptions) -> str | None:
    """Deletions found with no workdir set: providers ran in kl's own directory, which nobody said
    is the Terraform configuration's, and a relative path read from the wrong one looks gone (even
    a single one, which the mass-removal guard lets through). Such a run commits nothing."""
    if options.workdir is not None:
        return None
    gone = sorted(e.inst.address for e in entries if e.update is not None and e.update.removed)
    if not gone:
        return None
    return (f"{len(gone)} instance(s) came back deleted (first: {gone[0]}) and state {name!r} has no workdir, so "
            f"providers ran in {os.getcwd()}, where relative paths may not resolve; nothing committed: "
            f"set one with `kl state set {name} --workdir DIR` (or give --workdir DIR for this run)")


def check_workdir(name: str, options: RefreshOptions) -> None:
    if options.workdir is not None and not os.path.isdir(options.workdir):
        raise KlError(f"workdir {options.workdir} of state {name!r} does not exist on this host; nothing was refreshed "
                      f"(`kl state set {name} --workdir DIR` changes it, --workdir DIR overrides it for one run)")




def refuse_if_locked(conn: psycopg.Connection, sid: str, name: str, commit: bool,
                     hint: str | None = "--lock-timeout DURATION waits for it; --dry-run does not need it") -> None:
    """An observation writes nothing Terraform reads, so a plan's lock does not stop it; any other
    operation (an apply, an import) may be changing what it would read. A commit needs the state."""
    holder = locks.current(conn, sid)
    if holder is not None and (commit or locks.may_change_objects(holder)):
        raise locks.StateLocked(name, holder, hint)
