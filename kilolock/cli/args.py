"""What kl's arguments mean, shared by the commands: argument types (argparse turns what they
reject into a usage error, exit 2), ``--format``, and the inputs arguments name (the actor, a
FILE or ``-``). Light imports only: every ``kl COMMAND --help`` loads this."""
from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from kilolock.errors import KlError, UsageError
from kilolock.names import BadName, check_state_name, check_stored_name

MAX_COUNT = 2**31 - 1


def utf8_text(text: str) -> str:
    # An argument that is not UTF-8 reaches Python with surrogate escapes, which psycopg cannot
    # send: without this it surfaced as an internal UnicodeEncodeError.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid UTF-8 text") from None
    return text


def state_name(text: str) -> str:
    """A state that may exist: what the states table accepts."""
    utf8_text(text)
    try:
        return check_stored_name(text)
    except BadName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def new_state_name(text: str) -> str:
    """A name for a state kl may create: also what ``kl serve`` accepts in a URL."""
    state_name(text)
    try:
        return check_state_name(text)
    except BadName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    if n > MAX_COUNT:  # limits reach SQL as bigint: a larger one was an internal error there
        raise argparse.ArgumentTypeError(f"{text!r} is too large (at most {MAX_COUNT})")
    return n


def parallelism(text: str) -> int | str:
    """``--provider-parallelism auto|N``: requests in flight per provider process."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor a whole number of at least 1") from None


def serial(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= n < 2**63:  # serials are bigint, never negative
        raise argparse.ArgumentTypeError(f"{text!r} is not a state serial (0 or more, below 2^63)")
    return n


def version_ref(text: str) -> tuple[int, int | None]:
    """A version as kl names it: Terraform's serial (7), or an observation of it (7.3; a leading v
    is allowed, as `kl state versions` prints them): (serial, observation number or None)."""
    body = text[1:] if text[:1] in ("v", "V") else text
    head, dot, tail = body.partition(".")
    # Digits only: int() would also take "+7", " 7" or "7_0", which kl never prints.
    if not head.isdigit() or (dot and not tail.isdigit()) or (dot and not 1 <= int(tail) < 2**31):
        raise argparse.ArgumentTypeError(f"{text!r} is not a version: a serial (7) or an observation (7.3)")
    return serial(head), int(tail) if dot else None


def add_format(parser: argparse.ArgumentParser, *, markdown: bool = False) -> None:
    """``--format table|json``: every command that prints data offers both (render.py); drift
    reports add markdown, for CI step summaries and pull-request comments."""
    choices = ("table", "json", "markdown") if markdown else ("table", "json")
    parser.add_argument("--format", choices=choices, default="table",
                        help="output: " + ", ".join(choices) + " (default table; json is stable for tools)")


def state_glob(text: str) -> str:
    """``--states GLOB`` (kilolock.globs): * within one /-separated segment, ** across."""
    utf8_text(text)
    from kilolock.globs import compile_glob

    try:
        compile_glob(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def address_glob(text: str) -> str:
    """``--address GLOB`` (kilolock.globs): * within one .-separated segment, ** across; written as
    Terraform writes addresses (a string key quoted)."""
    utf8_text(text)
    from kilolock.globs import check_address_glob

    try:
        check_address_glob(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def attribute_path(text: str) -> str:
    """``--path``: an attribute path as Terraform writes one (tags["env"], rule[0].cidr)."""
    utf8_text(text)
    from kilolock.schema import drift_path_parse

    try:
        drift_path_parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def type_glob(text: str) -> str:
    """``--type GLOB``: resource type names with * and ?."""
    return str(_inventory_arg("type_glob", text))


def provider_source(text: str) -> str:
    """``--provider SOURCE``: the full source of HOST/NAMESPACE/TYPE, NAMESPACE/TYPE or TYPE."""
    return str(_inventory_arg("provider_source", text))


def where(text: str) -> object:
    """``--where PATH=VALUE`` (kilolock.inventory.where)."""
    return _inventory_arg("where", text)


def _inventory_arg(reader: str, text: str) -> Any:
    utf8_text(text)
    import kilolock.inventory

    try:
        return getattr(kilolock.inventory, reader)(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> float:
    """``--expires``: 30s, 15m, 12h, 7d (and combinations: 1d12h)."""
    from kilolock.durations import parse_duration

    try:
        return parse_duration(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = "unknown"
    return f"{user}@cli"


def read_input(path: str) -> bytes:
    """The bytes of a FILE argument, ``-`` meaning standard input."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise KlError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise KlError(f"{path}: is a directory, expected a state file") from None
    except PermissionError:
        raise KlError(f"{path}: permission denied") from None
    except OSError as exc:  # a name too long, a loop of symlinks, an I/O error: not a bug in kl
        raise KlError(f"{path}: cannot read: {exc.strerror or exc}") from None
