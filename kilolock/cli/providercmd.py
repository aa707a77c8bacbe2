"""``kl provider configure|pin|list|limit|limits``: provider configuration kept in provider_configs,
and fleet-wide limits of calls in flight (provider_limits)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from kilolock import jsondoc
from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError, UsageError


def normalize_source(text: str) -> str:
    """``hashicorp/null`` → ``registry.terraform.io/hashicorp/null``, as Terraform reads it."""
    parts = text.strip().split("/")
    if len(parts) == 2 and all(parts):
        return "registry.terraform.io/" + "/".join(parts)
    if len(parts) == 3 and all(parts):
        return "/".join(parts)
    raise UsageError(f"provider source {text!r} must be NAMESPACE/TYPE or HOST/NAMESPACE/TYPE")


def _describe_secret_free(config: dict[str, Any]) -> str:
    keys = sorted(config)
    return ", ".join(f"{k}=(env {config[k]['env']})" if isinstance(config[k], dict) and set(config[k]) == {"env"} else k for k in keys) or "(empty)"


def _load_config(raw: bytes, where: str) -> dict[str, Any]:
    try:
        config = jsondoc.load(raw)
    except jsondoc.NotStorable as exc:
        raise KlError(f"{where}: {exc}") from None
    if not isinstance(config, dict):
        raise KlError(f"{where}: a provider config must be a JSON object")
    return config


def add_configure_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=cli_args.utf8_text, help="NAMESPACE/TYPE or HOST/NAMESPACE/TYPE")
    parser.add_argument("--alias", type=cli_args.utf8_text, default="", help="the provider configuration's alias (default: none)")
    parser.add_argument("--state", type=cli_args.state_name, help="only for this state (default: every state)")
    parser.add_argument("--config", required=True, metavar="FILE", help="JSON file, or - for standard input")


def run_configure(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import provider_configs, states

    source = normalize_source(args.source)
    raw = cli_args.read_input(args.config)
    config = _load_config(raw, args.config)
    with context.open_store() as conn:
        sid = states.state_id(conn, args.state) if args.state else None
        provider_configs.upsert(conn, sid, source, args.alias, config=config)
    scope = f"state {args.state}" if args.state else "all states"
    print(f"{source}{'.' + args.alias if args.alias else ''} ({scope}): config stored: {_describe_secret_free(config)}")
    return 0


def add_pin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=cli_args.utf8_text, help="NAMESPACE/TYPE or HOST/NAMESPACE/TYPE")
    parser.add_argument("version", type=cli_args.utf8_text, help="the version to use, e.g. 3.2.1")
    parser.add_argument("--alias", type=cli_args.utf8_text, default="", help="the provider configuration's alias (default: none)")
    parser.add_argument("--state", type=cli_args.state_name, help="only for this state (default: every state)")


def run_pin(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import provider_configs, states

    source = normalize_source(args.source)
    version = args.version.lstrip("v")
    with context.open_store() as conn:
        sid = states.state_id(conn, args.state) if args.state else None
        provider_configs.upsert(conn, sid, source, args.alias, pinned_version=version)
    print(f"{source}{'.' + args.alias if args.alias else ''}: pinned to {version}")
    return 0


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import provider_configs, provider_schemas

    with context.open_store() as conn:
        rows = provider_configs.list_all(conn)
        schemas = provider_schemas.list_cached(conn)
    if args.format == "json":
        render.emit_json({"version": 1,
                          "configs": [{"state": s, "source": c.source, "alias": c.alias, "config_keys": sorted(c.config),
                                       "pinned_version": c.pinned_version} for s, c in rows],
                          "cached_schemas": [{"source": c.source, "version": c.version, "protocol": c.protocol_version,
                                              "fetched_at": c.fetched_at} for c in schemas]})
        return 0
    if not rows and not schemas:
        # An empty table says nothing: say what that means for a refresh.
        print("no provider configured, pinned or cached: refresh gives each provider an empty config "
              "and uses the highest version found (kl provider configure / kl provider pin)")
        return 0
    if rows:
        render.table(["source", "alias", "state", "pinned", "config"],
                     [(c.source, c.alias or "-", s or "(all)", c.pinned_version, _describe_secret_free(c.config)) for s, c in rows])
    else:
        print("no provider configured or pinned: refresh gives each provider an empty config")
    if schemas:
        print()
        render.table(["cached schema", "version", "protocol", "fetched"],
                     [(c.source, c.version, c.protocol_version, c.fetched_at) for c in schemas])
    return 0


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=cli_args.utf8_text, help="NAMESPACE/TYPE or HOST/NAMESPACE/TYPE")
    parser.add_argument("--alias", type=cli_args.utf8_text, default="",
                        help="the provider configuration's alias the limit is for (default: the one without an alias)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--max-in-flight", type=cli_args.positive, metavar="N",
                      help="the most calls to this provider in flight at once, across every kl process sharing the database")
    what.add_argument("--remove", action="store_true", help="remove the limit")


def run_limit(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import provider_limits

    source = normalize_source(args.source)
    label = source + (f".{args.alias}" if args.alias else "")
    with context.open_store() as conn:
        if args.remove:
            if not provider_limits.remove_limit(conn, source, args.alias):
                raise KlError(f"provider {label} has no limit (kl provider limits lists them)")
            print(f"{label}: no fleet-wide limit any more")
            return 0
        provider_limits.set_limit(conn, source, args.alias, args.max_in_flight, cli_args.default_actor())
        unused = not provider_limits.source_in_use(conn, source, args.alias)
    # Processes read limits when a run starts; a running worker within a few seconds.
    print(f"{label}: at most {args.max_in_flight} call(s) in flight across the fleet")
    if unused:
        # Set all the same: a limit may well come before the states that need it.
        undo = f"kl provider limit {args.source}" + (f" --alias {args.alias}" if args.alias else "") + " --remove"
        print(f"kl: note: no stored state uses provider {label} now (misspelt? {undo} undoes it); "
              "the limit applies to runs that do", file=sys.stderr)
    return 0


def add_limits_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run_limits(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import provider_limits

    with context.open_store() as conn:
        rows = provider_limits.usage(conn)
    if args.format == "json":
        render.emit_json({"version": 1, "limits": [
            {"source": r.source, "alias": r.alias or None, "max_in_flight": r.max_in_flight, "held": r.held,
             "wanted": r.wanted, "holders": r.holders, "set_at": r.created_at, "set_by": r.created_by} for r in rows]})
        return 0
    if not rows:
        print("no fleet-wide provider limit: each run's own --provider-parallelism applies (kl provider limit)")
        return 0
    render.table(["source", "alias", "max in flight", "held now", "wanted now", "processes", "set by"],
                 [(r.source, r.alias or "-", r.max_in_flight, r.held, r.wanted, r.holders, r.created_by or "-") for r in rows])
    return 0
