"""kl's command table: every command's name, one-line summary and module, as pip keeps its own.

``kl --help`` and ``kl GROUP --help`` are built from this table alone; a command's module is
imported only when that command is chosen (to add its arguments, then to run it), so start-up
never pays for psycopg or grpc. The convention a module follows:

- a command of its own (``kl refresh``): ``add_arguments(parser)`` and ``run(args) -> int``;
- a module that owns a group (``kl state ACTION``): ``add_<action>_arguments(parser)`` and
  ``run_<action>(args) -> int`` for each action.

A command module keeps its top-level imports light (its heavy ones go inside its run
functions): ``kl COMMAND --help`` imports it.
"""
from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple


class Command(NamedTuple):  # not a dataclass: importing dataclasses costs kl --help ~6 ms
    name: str
    summary: str
    module: str = ""  # empty for a group: its actions have the modules
    action: str = ""  # set when the module owns a group: names the action's pair of functions
    actions: tuple[Command, ...] = ()

    def _module(self) -> ModuleType:
        return importlib.import_module(self.module)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add: Callable[[argparse.ArgumentParser], None] = getattr(
            self._module(), f"add_{self.action}_arguments" if self.action else "add_arguments")
        add(parser)

    def run(self, args: argparse.Namespace) -> int:
        run: Callable[[argparse.Namespace], int] = getattr(self._module(), f"run_{self.action}" if self.action else "run")
        return run(args)


def _group(name: str, summary: str, module: str, actions: tuple[tuple[str, str], ...]) -> Command:
    return Command(name, summary, actions=tuple(Command(a, s, module, a) for a, s in actions))


COMMANDS: tuple[Command, ...] = (
    Command("version", "print versions, codec backend and paths", "kilolock.cli.versioncmd"),
    _group("db", "manage the database", "kilolock.cli.dbcmd", (
        ("migrate", "apply pending migrations"),
        ("status", "show which database is used and its migrations"),
        ("stop", "stop the embedded PostgreSQL server"),
    )),
    _group("state", "import, list and read state versions", "kilolock.cli.statecmd", (
        ("import", "store a Terraform state file as a new version"),
        ("list", "list states"),
        ("versions", "list the versions of a state"),
        ("pull", "print a state version as Terraform state JSON"),
    )),
    Command("status", "summary of a state: serial, counts, refresh, drift", "kilolock.cli.statuscmd"),
    Command("refresh", "ask every managed resource's provider what it looks like now; commit a new version",
            "kilolock.cli.refreshcmd"),
    Command("drift", "what refresh found changed or deleted, since when; --all: resolved drift too", "kilolock.cli.driftcmd"),
    Command("runs", "refresh runs of a state (the audit trail)", "kilolock.cli.runscmd"),
    Command("serve", 'serve Terraform\'s backend "http" (state and locking) from the store', "kilolock.cli.servecmd"),
    _group("provider", "provider configuration and version pins", "kilolock.cli.providercmd", (
        ("configure", 'store a provider\'s config (JSON; values may be {"env": "NAME"}, resolved at run time)'),
        ("pin", "use this provider version instead of the highest found"),
        ("list", "stored provider configs, pins and cached schemas"),
    )),
)
