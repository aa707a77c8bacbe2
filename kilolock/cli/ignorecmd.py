"""``kl drift ignore add|list|remove``: rules that hide drift records from open drift.

A rule never deletes a record: ``kl drift --all`` shows what it hides as ``ignored`` with the rule,
and removing the rule (or its expiry) makes the records open drift again. kl routes ``kl drift
ignore ...`` here before ``kl drift STATE`` parses (kilolock.cli.main), so a state literally named
``ignore`` is reached as ``kl drift --states ignore``."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext

if TYPE_CHECKING:
    import psycopg


def rule_id(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rule id (a whole number, see `kl drift ignore list`)") from None
    if not 1 <= n < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rule id (see `kl drift ignore list`)")
    return n


def add_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--states", metavar="GLOB", required=True, type=cli_args.state_glob,
                        help="states whose name matches: * within one /-separated segment, ** across")
    parser.add_argument("--address", metavar="GLOB", required=True, type=cli_args.address_glob,
                        help="resource addresses that match: * within one .-separated segment, ** across")
    parser.add_argument("--path", metavar="ATTRIBUTE_PATH", type=cli_args.attribute_path,
                        help='only drift whose every change lies at or under this attribute path (tags["env"]; a set '
                             'element as kl drift shows it: member[={"name":"eve"}]); '
                             "a deleted object is ignored only by a rule without --path")
    parser.add_argument("--reason", type=cli_args.utf8_text, help="why: shown by list and by kl drift --all")
    parser.add_argument("--expires", metavar="DURATION", type=cli_args.duration,
                        help="the rule stops matching after this long: s, m, h or d (30m, 12h, 7d)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who adds it (default: $USER@cli)")


def run_add(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.schema import drift_path_parse
    from kilolock.store import ignore_rules

    rule = ignore_rules.NewRule(args.states, args.address, drift_path_parse(args.path) if args.path else None,
                                args.reason, args.expires)
    with context.open_store() as conn:
        new_id = ignore_rules.add_rule(conn, rule, args.actor or cli_args.default_actor())
        # Stored all the same (a rule may come before the states it is for), but a glob that
        # matches nothing is most often a typo, which would otherwise hide nothing, silently.
        unmatched = _unmatched(conn, args.states, args.address)
    if unmatched:
        print(f"kl: note: {unmatched}; rule {new_id} applies to those that appear "
              f"(`kl drift ignore remove {new_id}` undoes it)", file=sys.stderr)
    print(new_id)  # alone on stdout, for scripts: id=$(kl drift ignore add ...)
    return 0


_NEAR_ADDRESSES = 10_000  # beyond this many instances, no closest address is looked for


def _unmatched(conn: psycopg.Connection, states: str, address: str) -> str | None:
    """What a new rule's globs match nothing of now, in a few words with the closest name; None: they match."""
    import difflib

    from kilolock.store import ignore_rules
    from kilolock.store.states import no_state_matches

    if not ignore_rules.states_match(conn, states):
        return "--states: " + no_state_matches(conn, states)
    if ignore_rules.address_matches(conn, states, address):
        return None
    candidates = ignore_rules.some_addresses(conn, states, _NEAR_ADDRESSES + 1)
    close = difflib.get_close_matches(address, candidates, n=1, cutoff=0.6) if len(candidates) <= _NEAR_ADDRESSES else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"--address {address!r} matches no instance of the states --states {states!r} matches{hint}"


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import ignore_rules

    with context.open_store() as conn:
        rows = ignore_rules.list_rules(conn)
    if args.format == "json":
        render.emit_json({"version": 1, "rules": [
            {"id": r["id"], "states": r["states_glob"], "address": r["address_glob"], "path": r["path"],
             "reason": r["reason"], "created_at": r["created_at"], "created_by": r["created_by"],
             "expires_at": r["expires_at"], "expired": r["expired"], "hides": r["hidden"]} for r in rows]})
        return 0
    if not rows:
        print("no drift ignore rules")
        return 0
    render.table(
        ["id", "states", "address", "path", "hides", "expires", "reason"],
        [(r["id"], r["states_glob"], r["address_glob"], r["path"], r["hidden"],
          (("expired " if r["expired"] else "") + render.when(r["expires_at"])) if r["expires_at"] else "never",
          r["reason"]) for r in rows],
    )
    return 0


def add_remove_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", type=rule_id, help="the rule's id (kl drift ignore list)")


def run_remove(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import ignore_rules

    with context.open_store() as conn:
        ignore_rules.remove_rule(conn, args.id)
    print(f"removed drift ignore rule {args.id}: what it hid is open drift again")
    return 0
