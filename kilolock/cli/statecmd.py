"""``kl state import|list|versions|pull|diff|set|show|unlock|rm|mv``."""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from kilolock import tfstate
from kilolock.cli import args as cli_args
from kilolock.cli import render, stateremove
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError, UsageError
from kilolock.globs import compile_glob
from kilolock.names import BadName, check_state_name

if TYPE_CHECKING:
    import psycopg



def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.new_state_name,
                        help="state name: letters, digits and . _ @ + = - in '/'-separated segments")
    parser.add_argument("file", help="state file, or - for standard input")
    parser.add_argument("--source", choices=("import", "apply", "refresh"), default="import",
                        help="what the version records as its origin (default import)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who wrote it (default: $USER@cli)")
    parser.add_argument("--force", action="store_true", help="accept a different lineage")


def run_import(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import writes

    origin = "<stdin>" if args.file == "-" else args.file
    # Only one whole copy of the input at a time: its text, then its bytes again, which UTF-8 gives
    # back exactly. A state as Terraform lays it out is indexed an instance at a time; anything
    # else is parsed whole (its parsed form outweighs the text 3x, and is freed once indexed).
    text = tfstate.decode_text(cli_args.read_input(args.file), origin)
    state: tfstate.State | None = tfstate.index_state_text(text, origin)
    envelope, upgraded, sealed = None, False, None
    if state is None:
        doc = tfstate.load_json(text, origin)
        # An OpenTofu-encrypted file is stored as `kl serve` stores one: as written, at the serial
        # it carries in the clear (or numbered after the current version), and indexed when the
        # state has its encryption configured.
        encrypted = tfstate.is_encrypted_envelope(doc)
        envelope = tfstate.envelope_ids(doc, origin) if encrypted else None
        sealed = doc if encrypted else None
        # Version 3 (Terraform 0.11, Terraformer): stored as the version-4 document Terraform reads it as.
        doc, upgraded = tfstate.upgrade_if_v3(doc, origin)
        if upgraded:
            text = tfstate.dumps_compact(doc)
        # Every input error surfaces before the database is touched. An index, not the parsed
        # document: the bytes are stored as they are.
        state = None if encrypted else tfstate.parse_state(doc, origin, keep_objects=False)
        del doc
    raw = text.encode("utf-8")
    del text
    with context.open_store() as conn:
        index = None
        if sealed is not None:
            from kilolock.server import store_ops

            # Unlike kl serve, which must take what OpenTofu sends, an import that cannot be
            # decrypted with the state's configuration is refused: nothing is written.
            index = store_ops.decrypted_index(conn, args.name, sealed, origin)
            if index is not None and envelope is None:
                envelope = tfstate.EnvelopeIds(index.state.serial, index.state.lineage)
            del sealed
        try:
            actor = args.actor or cli_args.default_actor()
            if state is None:
                result = writes.store_envelope(conn, args.name, raw, envelope, source=args.source, actor=actor,
                                               force=args.force, origin=origin, index=index,
                                               unindexed="OpenTofu-encrypted, and the state has no encryption configured")
            else:
                result = writes.store_document(conn, args.name, state, raw, source=args.source, actor=actor,
                                               force=args.force, origin=origin)
        except writes.SerialBehind as behind:
            raise KlError(behind_message(behind, origin, args.file)) from None
    v = result.version
    if not result.created:
        print(f"{args.name}: serial {v.serial} is already the current version (identical content); nothing written")
        return 0
    if state is None and index is not None:
        print(f"{args.name}: stored serial {v.serial} ({args.source}), OpenTofu-encrypted (kept as written), "
              f"{len(index.state.instances)} instances decrypted and indexed"
              f"{' (sensitive values masked)' if index.masked else ' (unmasked: --store-decrypted-attributes)'}: "
              f"{result.opened} lifecycles opened, {result.closed} closed, {result.unchanged} unchanged")
        return 0
    if state is None:
        print(f"{args.name}: stored serial {v.serial} ({args.source}), OpenTofu-encrypted: kept as is, not indexed "
              f"or refreshed (kl cannot read it without its encryption configured: kl state set {args.name} "
              "--encryption-config FILE)")
        return 0
    if upgraded:
        print(f"{args.name}: upgraded state format version 3 to 4 as Terraform does (its flatmap attributes are "
              "upgraded by each provider at the first refresh)")
    print(
        f"{args.name}: stored serial {v.serial} ({args.source}), {len(state.instances)} instances: "
        f"{result.opened} lifecycles opened, {result.closed} closed, {result.unchanged} unchanged"
    )
    return 0


_WRITTEN_BY = {"refresh": "kl refresh", "apply": "a Terraform apply", "import": "kl state import"}


def behind_message(behind: Any, origin: str, file: str) -> str:
    """Why an import whose serial does not advance the state's is refused, and what to do, in one
    line: most often the file is the one imported before a refresh committed newer versions."""
    name, held, serial = behind.name, behind.held, behind.new_serial
    later = [v for v in behind.newer if v.serial > serial]
    if later:
        by = ", ".join(dict.fromkeys(_WRITTEN_BY.get(v.source, v.source) for v in later))
        span = f"serial {held.serial}" if len(later) == 1 else f"serials {later[0].serial}-{held.serial}"
        why = f"kl has committed newer versions since ({span}, by {by})"
    else:
        same = next((v for v in behind.newer if v.serial == serial), held)
        why = (f"kl's serial {serial} (by {_WRITTEN_BY.get(same.source, same.source)}) has other content: "
               "the file and kl's copy went separate ways from the same serial")
    known = f", which kl already holds as serial {behind.known}" if behind.known is not None else ""
    target = "terraform.tfstate" if file == "-" else file
    return (f"{origin} has serial {serial}{known}, behind state {name!r} at serial {held.serial}: {why}; "
            f"nothing was written. To go on from kl's copy: `kl state pull {name} > {target}` "
            f"(--force does not help: it accepts another lineage, never an older serial)")


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--states", metavar="GLOB", type=cli_args.state_glob,
                        help="only states whose name matches: * within one /-separated segment, ** across")
    cli_args.add_format(parser)


def run_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import summary

    with context.open_store() as conn:
        rows = summary.list_states(conn)
    if args.states is not None:
        pattern = compile_glob(args.states)
        rows = [r for r in rows if pattern.fullmatch(r["name"])]
    if args.format == "json":
        render.emit_json({"version": 1, "states": rows})
        return 0
    render.table(
        ["name", "serial", "versions", "resources", "updated"],
        [(r["name"], r["serial"], r["versions"], r["resources"], r["updated_at"]) for r in rows],
    )
    return 0


def add_versions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    cli_args.add_format(parser)


def run_versions(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import versions

    with context.open_store() as conn:
        rows = versions.list_versions(conn, args.name)
    if args.format == "json":
        render.emit_json(
            {
                "version": 1,
                "state": args.name,
                "versions": [
                    {"serial": v.serial, "kind": v.kind, "observation": v.observation_number, "label": v.label,
                     "lineage": v.lineage, "source": v.source, "terraform_version": v.terraform_version,
                     "actor": v.actor, "created_at": v.created_at, "content_hash": v.content_hash,
                     "confirms": v.confirms}
                    for v in rows
                ],
            }
        )
        return 0
    render.table(["version", "kind", "source", "actor", "terraform", "created"], _folded(rows))
    return 0


def _folded(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Table rows, Terraform's versions and observations in the order written, with each run of
    observations that confirmed their base unchanged folded into one row."""
    out: list[tuple[Any, ...]] = []
    run: list[Any] = []

    def flush() -> None:
        if len(run) == 1:
            v = run[0]
            out.append((v.label, "observation", v.source, v.actor, v.terraform_version, v.created_at))
        elif run:
            first, last = run[0], run[-1]
            out.append((f"{first.label}-{last.label}", f"confirmed unchanged ×{len(run)}", last.source, last.actor,
                        last.terraform_version, f"last at {render.timestamp(last.created_at)}"))
        run.clear()

    for v in rows:
        if v.confirms and (not run or run[-1].base_version_id == v.base_version_id):
            run.append(v)
            continue
        flush()
        if v.confirms:
            run.append(v)
        elif v.kind == "observation":
            out.append((v.label, "observation", v.source, v.actor, v.terraform_version, v.created_at))
        else:
            out.append((v.label, "terraform", v.source, v.actor, v.terraform_version, v.created_at))
    flush()
    return out


def add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--serial", type=cli_args.serial, help="a past version (default: the current one)")
    which.add_argument("--observed", action="store_true",
                       help="the latest observation (what refresh read), as a state file carrying its base's serial "
                            "and lineage: `kl drift accept` makes it Terraform's, `terraform state push` refuses it")


def run_pull(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import observations, states, versions

    with context.open_store() as conn:
        observation = None
        if args.observed:
            observation = observations.latest(conn, states.state_id(conn, args.name))
            if observation is None:
                raise KlError(f"state {args.name!r} has no observation yet: `kl refresh {args.name}` records one")
        versions.write_pulled(conn, args.name, args.serial, sys.stdout.write,
                              version_id=observation.id if observation else None)
    return 0


def add_diff_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    parser.add_argument("serial_from", metavar="FROM", nargs="?", type=cli_args.version_ref,
                        help="the version to compare from: a serial, or an observation as 7.3 (default: the one "
                             "before the current version)")
    parser.add_argument("serial_to", metavar="TO", nargs="?", type=cli_args.version_ref,
                        help="the version to compare to: a serial or an observation (default: the current version; "
                             "either may be the older)")
    parser.add_argument("--observed", action="store_true",
                        help="Terraform's current version → the latest observation (what the last refresh read)")
    cli_args.add_format(parser, markdown=True)


def _serial_of(ref: tuple[int, int | None] | None) -> int | None:
    return None if ref is None else ref[0]


def run_diff(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.cli import statediff
    from kilolock.store import history

    refs = [r for r in (args.serial_from, args.serial_to) if r is not None]
    if args.observed and refs:
        raise UsageError("kl state diff: --observed compares Terraform's current version with the latest "
                         "observation; give it without FROM and TO")
    if args.observed or any(number is not None for _, number in refs):
        # Versions and observations are never changed once written, so reading the observation's
        # document in a snapshot of its own (versions.load_document) reads the same versions.
        with context.open_store() as conn:
            sid, a, b = history.observation_endpoints(conn, args.name, args.serial_from, args.serial_to,
                                                      observed=args.observed)
            rows = [] if a.label == b.label else history.differing_between(conn, sid, args.name, a, b)
            schemas = history.cached_schemas(conn, statediff.schema_keys(rows))
        doc = statediff.document(args.name, a.serial, b.serial, rows, schemas, label_from=a.label, label_to=b.label)
    else:
        with context.open_store() as conn, conn.transaction():  # one snapshot: the serials checked are the ones read
            sid, serial_from, serial_to = history.endpoints(conn, args.name, _serial_of(args.serial_from),
                                                            _serial_of(args.serial_to))
            rows = [] if serial_from is None else history.differing_objects(conn, sid, serial_from, serial_to)
            schemas = history.cached_schemas(conn, statediff.schema_keys(rows))
        doc = statediff.document(args.name, serial_from, serial_to, rows, schemas)
    if args.format == "json":
        render.emit_json(doc)
    elif args.format == "markdown":
        statediff.render_markdown(doc)
    else:
        statediff.render_table(doc)
    return 0


# --- per-state refresh settings (state_settings) ---------------------------------------------------

SETTINGS = ("workdir", "provider-search-path", "provider-parallelism", "actor", "encryption-config",
            "store-decrypted-attributes")


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    parser.add_argument("--workdir", type=cli_args.utf8_text, metavar="DIR",
                        help="where kl refresh runs providers (the Terraform configuration's directory on the "
                             "refreshing host; a relative DIR is made absolute here)")
    parser.add_argument("--provider-search-path", action="append", type=cli_args.utf8_text, metavar="DIR",
                        help="where provider binaries are (repeatable; replaces the stored list)")
    parser.add_argument("--provider-parallelism", type=cli_args.parallelism, metavar="auto|N",
                        help="requests in flight per provider process: auto (adapts to the provider) or a fixed N")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who the state's refreshes are recorded as")
    parser.add_argument("--encryption-config", type=cli_args.utf8_text, metavar="FILE",
                        help="OpenTofu's encryption block as JSON (pbkdf2 + aes_gcm, passphrases as {\"env\": NAME}): "
                             "kl decrypts the state to index and refresh it, and writes it back encrypted")
    parser.add_argument("--store-decrypted-attributes", action="store_true", default=None,
                        help="index an encrypted state's sensitive values unmasked in PostgreSQL (default: masked)")
    parser.add_argument("--unset", action="append", choices=SETTINGS, metavar="SETTING", default=[],
                        help=f"remove a stored setting (repeatable): {', '.join(SETTINGS)}")


def run_set(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import settings, states
    from kilolock.store.errors import StateNotFound

    given = {
        "workdir": os.path.abspath(args.workdir) if args.workdir else None,
        "provider_search_paths": tuple(os.path.abspath(p) for p in args.provider_search_path) if args.provider_search_path else None,
        "provider_parallelism": args.provider_parallelism,
        "actor": args.actor,
        "encryption": _encryption_config(args.encryption_config) if args.encryption_config else None,
        "store_decrypted_attributes": args.store_decrypted_attributes,
    }
    values = {k: v for k, v in given.items() if v is not None}
    unset = tuple(dict.fromkeys(settings.COLUMNS[u] for u in args.unset))
    if not values and not unset:
        raise UsageError(f"kl state set: nothing to change: give --{' / --'.join(SETTINGS)} or --unset SETTING")
    both = sorted(set(values) & set(unset))
    if both:
        flag = next(k for k, c in settings.COLUMNS.items() if c == both[0])
        raise UsageError(f"kl state set: --{flag} and --unset {flag} together; give one")
    with context.open_store() as conn:
        try:
            sid = states.state_id(conn, args.name)
        except StateNotFound:
            if "encryption" not in values:
                raise
            # Set before the first encrypted write, so kl serve indexes OpenTofu's first apply.
            sid = _new_state(conn, args.name)
        stored = settings.update(conn, sid, settings.Changes(values, unset), cli_args.default_actor())
    print(f"{args.name}: settings stored")
    _show_settings(args.name, stored)
    if stored.workdir and not os.path.isdir(stored.workdir):
        print(f"note: {stored.workdir} is not a directory on this host; a refresh here would fail", file=sys.stderr)
    if "encryption" in values:
        missing = [n for n in encryption_env_names(stored.encryption) if n not in os.environ]
        if missing:
            print(f"note: {', '.join(missing)} is not set here: kl serve, kl state import and kl refresh need it where "
                  "they run", file=sys.stderr)
    return 0


def _new_state(conn: psycopg.Connection, name: str) -> str:
    from kilolock.store import states

    try:
        check_state_name(name)
    except BadName as exc:
        raise UsageError(f"kl state set: {exc}") from None
    sid = states.lock_state_row(conn, name, create=True)
    assert sid is not None
    return sid


def _encryption_config(path: str) -> dict[str, Any]:
    from kilolock import encryption

    return encryption.load_config_file(path)


def encryption_env_names(stored: dict[str, Any] | None) -> list[str]:
    from kilolock import encryption

    return [] if stored is None else encryption.parse_config(stored).env_names()


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    cli_args.add_format(parser)


def run_show(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import settings, states

    with context.open_store() as conn:
        stored = settings.get(conn, states.state_id(conn, args.name))
    if args.format == "json":
        render.emit_json({"version": 1, "state": args.name, "settings": stored.as_json(),
                          "updated_at": stored.updated_at, "updated_by": stored.updated_by})
        return 0
    _show_settings(args.name, stored)
    return 0


def _show_settings(name: str, stored: Any) -> None:
    paths = stored.provider_search_paths
    render.key_values([
        ("state", name),
        ("workdir", stored.workdir or "(not set: providers run in kl's directory and no deletion is committed)"),
        ("provider search path", ", ".join(paths) if paths else "(not set: $KL_PROVIDER_PATH and the defaults)"),
        ("provider parallelism", stored.provider_parallelism or "(not set: auto)"),
        ("actor", stored.actor or "(not set: $USER@cli)"),
        ("encryption", _encryption_text(stored)),
        ("updated", f"{render.text(stored.updated_at)} by {stored.updated_by}" if stored.updated_at else "-"),
    ])


def _encryption_text(stored: Any) -> str:
    if stored.encryption is None:
        return "(not set: an OpenTofu-encrypted version is stored as written, not indexed)"
    names = ", ".join(f"${n}" for n in encryption_env_names(stored.encryption))
    masked = ("sensitive values stored unmasked (--store-decrypted-attributes)" if stored.store_decrypted_attributes
              else "sensitive values masked in the index")
    return f"OpenTofu pbkdf2/aes_gcm, passphrase from {names}; {masked}"


# --- locks -----------------------------------------------------------------------------------------


def add_unlock_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    parser.add_argument("--lock-id", required=True, type=cli_args.utf8_text, metavar="ID",
                        help="the ID of the lock to release, as kl status shows it (the confirmation)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who unlocks it (default: $USER@cli)")


def run_unlock(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import locks, states

    with context.open_store() as conn:
        sid = states.state_id(conn, args.name)
        released = locks.unlock_by_id(conn, sid, args.name, args.lock_id, args.actor or cli_args.default_actor())
    if released is None:
        print(f"{args.name}: not locked; nothing unlocked")
        return 0
    print(f"{args.name}: unlocked lock {released.get('ID')} held by {released.get('Who') or 'someone'} "
          f"({released.get('Operation') or '?'}, since {released.get('Created') or '?'})")
    return 0


# --- removing and renaming -------------------------------------------------------------------------


def add_rm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    parser.add_argument("--force", action="store_true",
                        help="delete without asking (needed when standard input is not a terminal, as in scripts)")
    cli_args.add_format(parser)


def run_rm(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.server import store_ops
    from kilolock.store import errors, state_admin, states
    from kilolock.store.locks import StateLocked

    name = args.name
    with context.open_store() as conn:
        sid = states.state_id(conn, name)
        stateremove.refuse_locked(conn, sid, name, "not deleted")
        owned = state_admin.owned(conn, sid)
        uses = state_admin.glob_uses(conn, name)
        stateremove.confirm(args, name, f"delete state {name!r}", lambda out: stateremove.show_rm(name, owned, uses, out))
        try:
            gone = store_ops.delete_state(conn, name, None)
        except StateLocked as exc:  # locked since the check above
            raise KlError(stateremove.unlock_hint(exc)) from None
        if not gone:
            raise errors.StateNotFound(name)
    if args.format == "json":
        render.emit_json({"version": 1, "deleted": name, "owned": stateremove.owned_json(owned),
                          "kept": [stateremove.use_json(u) for u in uses]})
    else:
        if args.force:
            stateremove.show_rm(name, owned, uses, sys.stdout)
        print(f"{name}: deleted")
    return 0


def add_mv_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", metavar="OLD", type=cli_args.state_name, help="the state")
    parser.add_argument("new", metavar="NEW", type=cli_args.new_state_name,
                        help="its new name: letters, digits and . _ @ + = - in '/'-separated segments")
    parser.add_argument("--force", action="store_true",
                        help="rename without asking (needed when standard input is not a terminal, as in scripts)")
    parser.add_argument("--serve-url", metavar="URL", type=cli_args.utf8_text,
                        help="where Terraform reaches kl serve (https://HOST:PORT), to print the backend block in full")
    cli_args.add_format(parser)


def run_mv(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import state_admin, states
    from kilolock.store.locks import StateLocked

    old, new = args.old, args.new
    if old == new:
        raise KlError(f"kl state mv: {old!r} is already its name; nothing renamed")
    backend = stateremove.backend_block(args.serve_url, new)
    with context.open_store() as conn:
        sid = states.state_id(conn, old)
        stateremove.refuse_locked(conn, sid, old, "not renamed")
        if state_admin.exists(conn, new):
            raise state_admin.StateExists(new)
        count = state_admin.owned(conn, sid).versions
        uses = state_admin.glob_uses(conn, old, new)
        stateremove.confirm(args, old, f"rename state {old!r} to {new!r}", lambda out: stateremove.show_mv(old, new, uses, backend, out))
        try:
            state_admin.rename(conn, old, new)
        except StateLocked as exc:  # locked since the check above
            raise KlError(stateremove.unlock_hint(exc)) from None
    if args.format == "json":
        render.emit_json({"version": 1, "renamed": {"from": old, "to": new}, "versions": count,
                          "no_longer_match": [stateremove.use_json(u) for u in uses if u.matches and not u.matches_other],
                          "now_match": [stateremove.use_json(u) for u in uses if u.matches_other and not u.matches],
                          "backend": backend})
    else:
        if args.force:
            stateremove.show_mv(old, new, uses, backend, sys.stdout)
        versions_word = "version" if count == 1 else "versions"
        print(f"renamed state {old!r} to {new!r}: its {count} {versions_word}, history and settings go with it")
    return 0
