"""The command table (kilolock.cli.commands): help is built from it alone, and a command's module
is imported only when that command is chosen, without anything heavy until it runs."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kilolock.cli.commands import COMMANDS, Command

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("grpc", "psycopg", "google.protobuf", "kilolock.store", "kilolock.provider", "kilolock.refresh",
         "kilolock.server.http")

# Runs kl in a fresh interpreter and reports, after its output, every module it loaded
# (importlib.import_module bypasses -X importtime, so that cannot see command modules).
_PROBE = """
import json, sys
from kilolock.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
sys.exit(code)
"""


def _kl(*args: str) -> tuple[int, str, set[str]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", _PROBE, *args], check=False, capture_output=True, text=True, env=env,
                       timeout=60)
    out, _, modules = r.stdout.rpartition("\nMODULES ")
    return r.returncode, out + r.stderr, set(json.loads(modules))


def _leaves(commands: tuple[Command, ...] = COMMANDS, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Command]]:
    found = []
    for c in commands:
        found += _leaves(c.actions, path + (c.name,)) if c.actions else [(path + (c.name,), c)]
    return found


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def _one_line(text: str) -> str:
    return " ".join(text.split())  # argparse wraps long summaries


def test_kl_help_lists_every_command_without_importing_one():
    code, out, modules = _kl("--help")
    assert code == 0, out
    for c in COMMANDS:
        assert _one_line(f"{c.name} {c.summary}") in _one_line(out), c.name
    assert sorted(m for m in modules if m.startswith("kilolock.cli.") and m.endswith("cmd")) == []
    assert _heavy(modules) == []


@pytest.mark.parametrize("group", [c for c in COMMANDS if c.actions], ids=lambda c: c.name)
def test_a_group_help_lists_its_actions_without_importing_its_module(group):
    code, out, modules = _kl(group.name, "--help")
    assert code == 0, out
    for a in group.actions:
        assert _one_line(f"{a.name} {a.summary}") in _one_line(out), a.name
    assert group.actions[0].module not in modules


@pytest.mark.parametrize("path,command", [pytest.param(p, c, id=" ".join(p)) for p, c in _leaves()])
def test_every_command_help_loads_its_module_and_nothing_heavy(path, command):
    code, out, modules = _kl(*path, "--help")
    assert code == 0, out
    assert out.startswith(f"usage: kl {' '.join(path)} [-h]") and _one_line(command.summary) in _one_line(out)
    assert command.module in modules
    assert _heavy(modules) == []


@pytest.mark.parametrize("path,command", [pytest.param(p, c, id=" ".join(p)) for p, c in _leaves()])
def test_every_command_module_has_its_pair_of_functions(path, command):
    module = importlib.import_module(command.module)
    add = f"add_{command.action}_arguments" if command.action else "add_arguments"
    run = f"run_{command.action}" if command.action else "run"
    assert callable(getattr(module, add)) and callable(getattr(module, run))
    command.add_arguments(argparse.ArgumentParser(prog="kl " + " ".join(path)))  # adds without conflicts


def test_a_command_with_no_notification_to_send_never_loads_the_sender(db_url):
    # The sender (http.client, urllib) costs a small refresh ~10 ms: only a process that wrote
    # deliveries, or found some due, imports it (tests/notify cover that it then sends them).
    code, out, modules = _kl("state", "list")
    assert code == 0, out
    assert "kilolock.store.notify" in modules  # it did open the store
    assert "kilolock.notify.deliver" not in modules
