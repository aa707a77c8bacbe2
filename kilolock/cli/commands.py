"""kl's command table: every command's name, one-line summary and module, as pip keeps its own.

``kl --help`` and ``kl GROUP --help`` are built from this table alone; a command's module is
imported only when that command is chosen (to add its arguments, then to run it), so start-up
never pays for psycopg or grpc. The convention a module follows:

- a command of its own (``kl refresh``): ``add_arguments(parser)`` and ``run(args, context) -> int``;
- a module that owns a group (``kl state ACTION``): ``add_<action>_arguments(parser)`` and
  ``run_<action>(args, context) -> int`` for each action.

``context`` is the command's CommandContext: a command opens the store through it.

A command module keeps its top-level imports light (``kl COMMAND --help`` imports it): which
imports go inside its functions is kilolock.cli's rule, in its docstring.
"""
from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import psycopg


class CommandContext:
    """What a command opened, for what kl does once it has run: the notifications the command
    wrote (or found due) are sent to the database it opened, and a state name it did not find is
    matched against that database's names. A command opens the store through ``open_store``, so
    the store is asked only when the command did open it, and kl --help or kl version never loads
    the database driver."""

    __slots__ = ("store_url",)

    def __init__(self) -> None:
        self.store_url: str | None = None  # the database whose store the command opened

    def open_store(self, migrate: bool | None = None) -> psycopg.Connection:
        """kilolock.store.db.open_store, remembered."""
        from kilolock.store import db

        target = db.resolve_target()
        conn = db.open_store(migrate, target)
        self.store_url = target.url
        return conn


class Command(NamedTuple):  # not a dataclass: importing dataclasses costs kl --help ~6 ms
    name: str
    summary: str
    module: str = ""  # empty for a group: its actions have the modules
    action: str = ""  # set when the module owns a group: names the action's pair of functions
    actions: tuple[Command, ...] = ()
    example: str = ""  # shown at the end of the command's --help

    def _module(self) -> ModuleType:
        return importlib.import_module(self.module)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add: Callable[[argparse.ArgumentParser], None] = getattr(
            self._module(), f"add_{self.action}_arguments" if self.action else "add_arguments")
        add(parser)

    def run(self, args: argparse.Namespace, context: CommandContext) -> int:
        run: Callable[[argparse.Namespace, CommandContext], int] = getattr(
            self._module(), f"run_{self.action}" if self.action else "run")
        return run(args, context)


def _group(name: str, summary: str, module: str, actions: tuple[tuple[str, str, str], ...]) -> Command:
    return Command(name, summary, actions=tuple(Command(a, s, module, a, example=e) for a, s, e in actions))


# `kl drift ignore ACTION`: `kl drift` itself takes a positional STATE, so kilolock.cli.main routes
# `drift ignore` to this group before the drift parser sees it (a state named `ignore` is reached
# with `kl drift --states ignore`).
DRIFT_IGNORE = _group("ignore", "rules that hide drift from open drift; the records stay (kl drift --all)",
                      "kilolock.cli.ignorecmd", (
    ("add", "add a rule; prints its id",
     """kl drift ignore add --states 'team/**' --address 'null_resource.*' --path 'triggers["stamp"]' --expires 7d"""),
    ("list", "the rules, with how many open drift records each hides now", "kl drift ignore list --format json"),
    ("remove", "delete a rule: what it hid is open drift again", "kl drift ignore remove 3"),
))

# `kl access trust ACTION`: the OIDC issuers whose tokens kl serve accepts.
ACCESS_TRUST = Command("trust", "OIDC issuers whose JWTs kl serve accepts (principals oidc:NAME:SUB)", actions=(
    Command("oidc", "trust an issuer's tokens for an audience; keys from a JWKS file or URL (default: discovery)",
            "kilolock.cli.accesscmd", "trust_oidc",
            example="kl access trust oidc --issuer https://token.actions.githubusercontent.com --audience kilolock "
                    "--name github --claim repository_owner=acme"),
    Command("list", "the trusted issuers", "kilolock.cli.accesscmd", "trust_list", example="kl access trust list --format json"),
    Command("remove", "refuse an issuer's tokens from now on (its grants stay)", "kilolock.cli.accesscmd", "trust_remove",
            example="kl access trust remove github"),
))

# `kl drift accept STATE`, routed the same way.
DRIFT_ACCEPT = Command("accept", "write the latest observation (what refresh read) as Terraform's next version, "
                       "whole or the objects --address names", "kilolock.cli.acceptcmd",
                       example="kl drift accept prod --address 'aws_instance.web' --dry-run")

COMMANDS: tuple[Command, ...] = (
    Command("version", "print versions, codec backend and paths", "kilolock.cli.versioncmd", example="kl version"),
    _group("db", "manage the database", "kilolock.cli.dbcmd", (
        ("migrate", "apply pending migrations", "KL_DATABASE_URL=postgresql://kl@db/kl kl db migrate"),
        ("status", "show which database is used and its migrations", "kl db status"),
        ("stop", "stop the embedded PostgreSQL server", "kl db stop"),
    )),
    _group("state", "import, list and read state versions; per-state settings and lock; remove, rename", "kilolock.cli.statecmd", (
        ("import", "store a Terraform state file as a new version", "terraform state pull | kl state import prod -"),
        ("list", "list states", "kl state list --format json"),
        ("versions", "list the versions of a state", "kl state versions prod"),
        ("pull", "print a state version as Terraform state JSON", "kl state pull prod --serial 3 > prod-v3.tfstate"),
        ("diff", "what changed between two versions or observations (7.3), per instance and attribute (default: previous → current)",
         "kl state diff prod 41 42 --format markdown"),
        ("set", "store how a state is refreshed: its workdir, provider search path, parallelism, actor",
         "kl state set prod --workdir /srv/infra/prod"),
        ("show", "show a state's stored refresh settings", "kl state show prod --format json"),
        ("unlock", "release a state's lock given its ID (as terraform force-unlock)",
         "kl state unlock prod --lock-id 5c3a9b6e-0d4f-4e51-9d6c-2f1b7a8e4c10"),
        ("rm", "delete a state with its versions, runs, drift and settings (asks for its name; --force for scripts)",
         "kl state rm old/prod"),
        ("mv", "rename a state (its history follows); lists the globs it leaves and the backend URL to change",
         "kl state mv prod prod/eu --serve-url https://kl.internal:8080"),
    )),
    Command("status", "summary of a state: serial, counts, refresh, drift", "kilolock.cli.statuscmd",
            example="kl status prod"),
    Command("refresh", "ask every managed resource's provider what it looks like now; record it as an observation "
            "beside Terraform's version (--commit: as its next version)",
            "kilolock.cli.refreshcmd", example="kl refresh prod --dry-run"),
    Command("resources", "every open instance across the fleet: state, address, provider, identity or id, status, drift; "
            "--duplicates: objects claimed twice", "kilolock.cli.resourcescmd",
            example="kl resources --type aws_s3_bucket --where tags.env=prod --format json"),
    Command("drift", "what refresh found changed or deleted, since when; --all: resolved and ignored drift too; "
            "kl drift ignore: ignore rules; kl drift accept: make the observation Terraform's version", "kilolock.cli.driftcmd",
            example="kl drift prod"),
    Command("runs", "refresh runs of a state (the audit trail)", "kilolock.cli.runscmd", example="kl runs prod --stale"),
    Command("discover", "list a resource type's objects through its provider (ListResource) and match each against "
            "every state: managed, unmanaged, managed twice; --results: what the last run found", "kilolock.cli.discovercmd",
            example="kl discover hashicorp/aws --type aws_s3_bucket --state prod"),
    _group("notify", "notification channels (webhooks, Slack) for drift and refresh events, and their delivery log",
           "kilolock.cli.notifycmd", (
        ("add", "add a channel: events of matching states from now on are POSTed to it",
         """kl notify add ops --webhook '{"env": "SLACK_WEBHOOK_URL"}' --format slack --states 'prod/**'"""),
        ("list", "the channels (URLs and secrets never shown resolved)", "kl notify list --format json"),
        ("remove", "delete a channel and its deliveries", "kl notify remove ops"),
        ("test", "send one sample event to a channel now", "kl notify test ops"),
        ("log", "deliveries, newest first, with every attempt", "kl notify log --failed"),
    )),
    Command("serve", 'serve Terraform\'s backend "http" (state and locking) from the store', "kilolock.cli.servecmd",
            example="KL_SERVE_TOKEN=... kl serve --listen 127.0.0.1:8080"),
    Command("schedule", "when the fleet's workers refresh which states (and run which discoveries)", actions=(
        Command("set", "add a schedule: --states GLOB or --discover SOURCE --type TYPE, --every DURATION or --cron EXPR; "
                "prints its ID",
                "kilolock.cli.schedulecmd", "set", example="kl schedule set --states 'prod/**' --every 6h --jitter 30m"),
        Command("list", "the schedules, with each next run time (and its time zone)", "kilolock.cli.schedulecmd", "list",
                example="kl schedule list --format json"),
        Command("pause", "stop a schedule from firing until resumed", "kilolock.cli.schedulecmd", "pause",
                example="kl schedule pause 3"),
        Command("resume", "let a paused schedule fire again (a missed time runs once)", "kilolock.cli.schedulecmd",
                "resume", example="kl schedule resume 3"),
        Command("remove", "delete a schedule and the jobs it queued that no worker has claimed",
                "kilolock.cli.schedulecmd", "remove", example="kl schedule remove 3"),
        Command("run-now", "queue the states for the workers now, outside any schedule", "kilolock.cli.schedulecmd",
                "run_now", example="kl schedule run-now --states 'prod/eu/*'"),
    )),
    Command("worker", "claim due refreshes from the fleet's queue and run them (any number, on any hosts)",
            "kilolock.cli.workercmd", example="kl worker --parallel-states 4"),
    Command("fleet", "the fleet: workers, queue, lag, errors", actions=(
        Command("status", "live workers and what each runs, queue depth, lag behind schedule, last errors, provider limits",
                "kilolock.cli.fleetcmd", "status", example="kl fleet status --format json"),
        Command("prune", "forget workers that stopped or were lost (listed by kl fleet status for 1h / 1d)",
                "kilolock.cli.fleetcmd", "prune", example="kl fleet prune --older-than 1d"),
    )),
    Command("access", "who may do what to which state through kl serve: grants of a role on a state glob, OIDC trusts",
            actions=(*_group("access", "", "kilolock.cli.accesscmd", (
        ("grant", "give a principal (user, token, client certificate, OIDC subjects) a role on the states a glob matches",
         "kl access grant token:ci-net --role write --states 'net/**'"),
        ("revoke", "remove a principal's grant on a glob (or all of them)", "kl access revoke user:alice --states 'pay/**'"),
        ("list", "the grants, by principal", "kl access list --format json"),
        ("check", "what a principal may do on a state, and through which grant", "kl access check token:ci-net net/prod"),
        ("log", "the access audit: refusals, grant, token and trust changes, newest first", "kl access log --limit 20"),
    )).actions, ACCESS_TRUST)),
    Command("token", "tokens for kl serve: made here, shown once, stored as a hash", actions=(
        Command("create", "make a token with a role on a state glob; prints the secret once",
                "kilolock.cli.accesscmd", "create",
                example="kl token create ci-net --role write --states 'net/**' --expires 90d --format json"),
        Command("list", "the tokens: grants, expiry, last use (never the secret)", "kilolock.cli.accesscmd", "tokens_list",
                example="kl token list"),
        Command("revoke", "refuse a token from now on", "kilolock.cli.accesscmd", "tokens_revoke",
                example="kl token revoke ci-net"),
    )),
    Command("completion", "print a shell completion script (bash, zsh, fish): commands, options and state names",
            "kilolock.cli.completioncmd", example="source <(kl completion bash)"),
    _group("provider", "provider configuration, version pins and fleet-wide limits", "kilolock.cli.providercmd", (
        ("configure", 'store a provider\'s config (JSON; values may be {"env": "NAME"}, resolved at run time)',
         """echo '{"token": {"env": "GITHUB_TOKEN"}}' | kl provider configure integrations/github --config -"""),
        ("pin", "use this provider version instead of the highest found", "kl provider pin hashicorp/null 3.2.1"),
        ("list", "stored provider configs, pins and cached schemas", "kl provider list"),
        ("limit", "cap a provider's calls in flight across every worker and refresh on all hosts (or --remove it)",
         "kl provider limit hashicorp/aws --alias prod --max-in-flight 40"),
        ("limits", "fleet-wide provider limits, with the slots the fleet holds of each now", "kl provider limits"),
    )),
)
