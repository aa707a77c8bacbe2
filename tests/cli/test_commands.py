"""The command table (kilolock.cli.commands): help is built from it alone, and a command's module
is imported only when that command is chosen, without anything heavy until it runs."""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
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


# kilolock.cli's rule for imports inside functions (its docstring): one is kept only where it
# saves a command something. The light model modules are imported at the top of a command module;
# in the modules kl version and kl refresh STATE import before they run, whatever is not loaded by
# then may wait for the function that needs it; nowhere does an import of a module that is already
# loaded (it saves nothing and hides the dependency). Checks that import themselves stay.
CLI = REPO / "kilolock" / "cli"
LIGHT = {"kilolock.errors", "kilolock.durations", "kilolock.globs", "kilolock.cron", "kilolock.names",
         "kilolock.redact", "kilolock.jsondoc"}
START_UP = {"kilolock.cli", "kilolock.cli.commands", "kilolock.cli.args", "kilolock.cli.exitcodes",
            "kilolock.cli.render", "kilolock.cli.versioncmd", "kilolock.cli.refreshcmd"}


def _probes(tree: ast.AST) -> set[int]:
    """Lines of imports inside a ``try`` that catches ImportError: the import is the check."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in {"ImportError", "ModuleNotFoundError"} for h in node.handlers):
            found |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return found


def _target(base: str, name: str) -> str:
    """The module `from BASE import NAME` loads: BASE.NAME when that is a submodule."""
    try:
        return f"{base}.{name}" if importlib.util.find_spec(f"{base}.{name}") is not None else base
    except ModuleNotFoundError:  # BASE is a module, not a package
        return base


def function_level_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import inside a function, probes left out."""
    tree = ast.parse(source)
    probes = _probes(tree)
    found: set[tuple[int, str]] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if getattr(node, "lineno", None) in probes:
                    continue
                if isinstance(node, ast.Import):
                    found |= {(node.lineno, a.name) for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    found |= {(node.lineno, _target(node.module, a.name)) for a in node.names}
    return sorted(found)


def _loaded_with(module: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    probe = f"import json, sys, kilolock.cli, {module}\nprint(json.dumps(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=env, timeout=60)
    return set(json.loads(r.stdout))


def lazy_import_violations(module: str, source: str, loaded: set[str]) -> list[str]:
    out = []
    for line, target in function_level_imports(source):
        if target in loaded:
            out.append(f"{module}:{line} imports {target} in a function, though importing {module} loads it already")
        elif target in LIGHT and module not in START_UP:
            out.append(f"{module}:{line} imports {target} in a function: a light model module goes at the top")
    return out


def test_imports_inside_cli_functions_follow_the_rule():
    found = []
    for path in sorted(CLI.glob("*.py")):
        module = "kilolock.cli" if path.name == "__init__.py" else f"kilolock.cli.{path.stem}"
        found += lazy_import_violations(module, path.read_text(encoding="utf-8"), _loaded_with(module))
    assert not found, "see kilolock.cli's docstring for which imports stay inside functions:\n" + "\n".join(found)


def test_the_import_rule_catches_a_needless_lazy_import():
    source = ("def run():\n    import os\n    from kilolock.errors import KlError\n    from kilolock.store import db\n"
              "    try:\n        import ssl\n    except ImportError:\n        pass\n")
    assert function_level_imports(source) == [(2, "os"), (3, "kilolock.errors"), (4, "kilolock.store.db")]
    assert lazy_import_violations("kilolock.cli.statecmd", source, {"os"}) == [
        "kilolock.cli.statecmd:2 imports os in a function, though importing kilolock.cli.statecmd loads it already",
        "kilolock.cli.statecmd:3 imports kilolock.errors in a function: a light model module goes at the top"]
    assert lazy_import_violations("kilolock.cli.refreshcmd", source, set()) == []  # before its providers start
