"""What `kl state rm` and `kl state mv` show before they act: the rows a state owns, the grants,
ignore rules, channels and schedules whose globs match it, the backend block that changes, and the
typed-name confirmation; the commands themselves are in statecmd."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from kilolock.errors import KlError

if TYPE_CHECKING:
    import psycopg

    from kilolock.store.locks import StateLocked
    from kilolock.store.state_admin import GlobUse, Owned


def refuse_locked(conn: psycopg.Connection, sid: str, name: str, what: str) -> None:
    from kilolock.store import locks

    holder = locks.current(conn, sid)
    if holder is not None:
        raise KlError(unlock_hint(locks.StateLocked(name, holder, what)))


def unlock_hint(exc: StateLocked) -> str:
    """A refusal for a locked state, with how to release the lock once its holder is done or gone."""
    return (f"{exc}; when its holder is done, or gone: "
            f"`kl state unlock {exc.name} --lock-id {exc.holder.get('ID')}`")


def confirm(args: argparse.Namespace, name: str, action: str, show: Callable[[TextIO], None]) -> None:
    """Ask on the terminal for the state's NAME before ACTION (SHOW prints what it does), as other
    tools that destroy data do; refused without a terminal unless --force."""
    if args.force:
        return
    if not sys.stdin.isatty():
        raise KlError(f"standard input is not a terminal, so kl cannot ask before it would {action}: "
                      "nothing changed (--force to go ahead without asking)")
    # JSON on stdout is for tools: what a person must read before answering goes to the terminal's stderr.
    show(sys.stdout if args.format == "table" else sys.stderr)
    sys.stderr.write(f"To {action}, type its name: ")
    sys.stderr.flush()
    typed = sys.stdin.readline().strip()
    if typed != name:
        said = f"typed {typed!r}, not {name!r}" if typed else "no name typed"
        raise KlError(f"{said}; nothing changed")


_OWNED_WORDS = (
    ("versions", "version", "versions"), ("lifecycles", "instance lifecycle", "instance lifecycles"),
    ("refresh_runs", "refresh run", "refresh runs"), ("drift_records", "drift record", "drift records"),
    ("lock_events", "lock event", "lock events"), ("settings", "its stored refresh settings", ""),
    ("provider_configs", "provider config of its own", "provider configs of its own"),
    ("fleet_jobs", "queued refresh", "queued refreshes"), ("notify_events", "notification event", "notification events"),
)


def owned_json(owned: Owned) -> dict[str, int]:
    return {field: getattr(owned, field) for field, _, _ in _OWNED_WORDS}


def use_json(use: GlobUse) -> dict[str, Any]:
    return {"kind": use.kind, "key": use.key, "detail": use.detail, "states": use.states_glob, "remove": remove_command(use)}


def remove_command(use: GlobUse) -> str:
    import shlex

    if use.kind == "grant":
        return f"kl access revoke {shlex.quote(use.key)} --states {shlex.quote(use.states_glob)}"
    if use.kind == "ignore rule":
        return f"kl drift ignore remove {use.key}"
    if use.kind == "notify channel":
        return f"kl notify remove {shlex.quote(use.key)}"
    return f"kl schedule remove {use.key}"


def describe(use: GlobUse) -> str:
    if use.kind == "grant":
        return f"grant of {use.detail} to {use.key} on {use.states_glob!r}"
    if use.kind == "ignore rule":
        return f"ignore rule {use.key} ({use.detail!r}) on {use.states_glob!r}"
    return f"{use.kind} {use.key} on {use.states_glob!r}"


def show_uses(uses: list[GlobUse], out: TextIO) -> None:
    for use in uses:
        print(f"  {describe(use)}: {remove_command(use)}", file=out)


def show_rm(name: str, owned: Owned, uses: list[GlobUse], out: TextIO) -> None:
    counts = [one if not many else f"{n} {one if n == 1 else many}"
              for field, one, many in _OWNED_WORDS if (n := getattr(owned, field))]
    print(f"deleting state {name!r} deletes what is its own: {', '.join(counts) or 'no version yet'}", file=out)
    if uses:
        print("these name it by glob and stay (they may match other states; remove those that were for it alone):",
              file=out)
        show_uses(uses, out)


def backend_block(serve_url: str | None, name: str) -> dict[str, str]:
    """The URLs Terraform's backend "http" names a state by on kl serve (/states/NAME, one for all three)."""
    from urllib.parse import quote

    url = f"{(serve_url or '<kl serve URL>').rstrip('/')}/states/{quote(name, safe='/@+=')}"
    return {"address": url, "lock_address": url, "unlock_address": url}


def show_mv(old: str, new: str, uses: list[GlobUse], backend: dict[str, str], out: TextIO) -> None:
    gone = [u for u in uses if u.matches and not u.matches_other]
    came = [u for u in uses if u.matches_other and not u.matches]
    if gone:
        print(f"these matched {old!r} and do not match {new!r} (they stay as they are: change those meant to follow it):",
              file=out)
        show_uses(gone, out)
    if came:
        print(f"these did not match {old!r} and match {new!r} from now on:", file=out)
        show_uses(came, out)
    print("Terraform's backend \"http\" block for it reads, once renamed (then `terraform init -reconfigure`):", file=out)
    for key, url in backend.items():
        print(f"  {key.ljust(14)} = \"{url}\"", file=out)
    print(f"until then Terraform finds no state at /states/{old}: a plan there would create everything again",
          file=out)
