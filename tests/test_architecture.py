"""The layers of docs/architecture.md, enforced: each part of kilolock imports only what its
layer may see. Lazy imports inside functions count too: the CLI loads its commands lazily, and a
lazy import is still a dependency."""
from __future__ import annotations

import ast
from pathlib import Path

from kit.paths import REPO

PACKAGE = REPO / "kilolock"

# Pure data and rules on our own types: no I/O, no database, no protocol. Any layer may use them.
MODEL = {"kilolock", "kilolock.errors", "kilolock.durations", "kilolock.cron", "kilolock.jsondoc", "kilolock.names", "kilolock.globs",
         "kilolock.schema", "kilolock.tfstate", "kilolock.sensitive", "kilolock.redact", "kilolock.drift", "kilolock.versiondiff",
         "kilolock.encryption", "kilolock.attrsearch", "kilolock.inventory"}

# What each part may import besides itself and MODEL. The data flow: cli -> fleet -> refresh ->
# provider, with codec beside refresh and the store beside everything that keeps state.
ALLOWED: dict[str, set[str]] = {
    "kilolock.codec": {"kilolock._native"},
    "kilolock._native": set(),
    "kilolock.provider": set(),  # protocol only: never JSON values (codec) nor the database
    "kilolock.store": set(),  # SQL only: never a provider or a codec
    "kilolock.refresh": {"kilolock.codec", "kilolock._native", "kilolock.provider", "kilolock.store"},
    # Many states in one process (kl refresh --all, kl worker), each through the refresh service;
    # its warm pool is one more source of the refresh factory's processes. refresh never sees it.
    "kilolock.fleet": {"kilolock.refresh", "kilolock.provider", "kilolock.store", "kilolock.unmanaged"},
    # Discovery opens a provider through the refresh factory and matches what it lists in the store.
    "kilolock.unmanaged": {"kilolock.refresh", "kilolock.provider", "kilolock.store"},
    "kilolock.server": {"kilolock.store"},  # the backend stores and serves; it never refreshes
    "kilolock.notify": {"kilolock.store"},  # sends what the store's outbox holds; never refreshes
    "kilolock.cli": {"kilolock.codec", "kilolock._native", "kilolock.provider", "kilolock.store",
                     "kilolock.refresh", "kilolock.fleet", "kilolock.server", "kilolock.notify", "kilolock.gcpolicy",
                     "kilolock.unmanaged"},
    "kilolock.gcpolicy": set(),  # the process's collector: cli.run_process and `kl refresh` set it
    "kilolock.lazyimports": set(),  # modules imported only when used: kl's entry points set it up
    "kilolock.__main__": {"kilolock.cli", "kilolock.lazyimports"},
    "kilolock._pyz": {"kilolock.cli", "kilolock.lazyimports"},  # the zipapp bootstrap: the standard library, then the CLI
}
# One module each, beyond its part's rule: the extension is also the event loop's HTTP/2 transport
# and the AutoMTLS key's P-256, submodules the provider layer may use while it still never touches
# the codec (kilolock._native.codec).
MODULE_PERMITS = {("kilolock.provider.h2channel", "kilolock._native.transport"), ("kilolock.provider.certs", "kilolock._native.p256")}
# Packages whose `from PACKAGE import name` names a submodule: the extension's are its parts' jobs.
SUBMODULE_PACKAGES = {"kilolock", "kilolock._native"}
# Within MODEL the order matters too (no cycles): each may import only those before it.
MODEL_ORDER = ["kilolock", "kilolock.errors", "kilolock.durations", "kilolock.cron", "kilolock.jsondoc", "kilolock.names",
               "kilolock.globs", "kilolock.schema", "kilolock.tfstate", "kilolock.sensitive", "kilolock.redact", "kilolock.drift",
               "kilolock.versiondiff", "kilolock.encryption", "kilolock.attrsearch", "kilolock.inventory"]
# Inside a package likewise: each module may import only those before it, and the package itself
# (its __init__, which hands their names on) comes last.
PACKAGE_ORDER = {
    "kilolock.tfstate": ["kilolock.tfstate.checks", "kilolock.tfstate.addresses", "kilolock.tfstate.exactjson",
                         "kilolock.tfstate.parse", "kilolock.tfstate.streamed_index", "kilolock.tfstate.writer",
                         "kilolock.tfstate.version3", "kilolock.tfstate"],
}


def unit_of(module: str) -> str:
    """The part a module belongs to: a subpackage or a top-level module of kilolock."""
    parts = module.split(".")
    return ".".join(parts[:2])


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str) -> set[str]:
    """Every kilolock module SOURCE imports, at any depth in the file (relative imports resolved)."""
    package = module if module == "kilolock" or module.endswith("__init__") else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from kilolock import codec` imports the module kilolock.codec
            found.update(f"{base}.{a.name}" if base in SUBMODULE_PACKAGES else base for a in node.names)
    return {m for m in found if m == "kilolock" or m.startswith("kilolock.")}


def violations(module: str, source: str) -> list[str]:
    unit = unit_of(module)
    out = []
    for target in sorted(imported_modules(source, module)):
        to = unit_of(target)
        if to == unit and unit in PACKAGE_ORDER and target != module:
            order = PACKAGE_ORDER[unit]
            if not (module in order and target in order and order.index(target) < order.index(module)):
                out.append(f"{module} imports {target}")
            continue
        if to == unit or (module, target) in MODULE_PERMITS:
            continue
        if unit in MODEL:
            ok = to in MODEL and MODEL_ORDER.index(to) < MODEL_ORDER.index(unit)
        else:
            ok = to in MODEL or to in ALLOWED.get(unit, set())
        if not ok:
            out.append(f"{module} imports {target}")
    return out


def _modules() -> list[tuple[str, Path]]:
    return [(module_name(p), p) for p in sorted(PACKAGE.rglob("*.py")) if "_pb" not in p.parts]


def test_every_part_has_a_place_in_the_layers() -> None:
    units = {unit_of(name) for name, _ in _modules()}
    unplaced = units - MODEL - set(ALLOWED)
    assert not unplaced, f"new parts of kilolock need a layer in tests/test_architecture.py and docs/architecture.md: {sorted(unplaced)}"
    unordered = [name for name, _ in _modules() if name not in PACKAGE_ORDER.get(unit_of(name), [name])]
    assert not unordered, f"new modules of an ordered package need a place in PACKAGE_ORDER and docs/architecture.md: {unordered}"


def test_imports_follow_the_layers() -> None:
    found = [v for name, path in _modules() for v in violations(name, path.read_text(encoding="utf-8"))]
    assert not found, "imports that break docs/architecture.md's rules:\n" + "\n".join(found)


def test_the_rule_catches_a_layer_break() -> None:
    # The check above is only worth something if it can fail: a provider reaching for the store, a
    # lazy import in the server of the refresh path, a model module importing a later one.
    assert violations("kilolock.provider.client", "from kilolock.store import db") == [
        "kilolock.provider.client imports kilolock.store"]
    assert violations("kilolock.server.backend", "def f():\n    from kilolock import refresh\n") == [
        "kilolock.server.backend imports kilolock.refresh"]
    assert violations("kilolock.schema", "from kilolock.drift import Change") == [
        "kilolock.schema imports kilolock.drift"]
    assert violations("kilolock.store.versions", "from . import db\nfrom .. import tfstate") == []
    assert violations("kilolock.store.versions", "from ..provider import client") == [
        "kilolock.store.versions imports kilolock.provider"]
    # Inside an ordered package: a module importing a later one, or the package that re-exports it.
    assert violations("kilolock.tfstate.addresses", "from kilolock.tfstate.writer import _ordered") == [
        "kilolock.tfstate.addresses imports kilolock.tfstate.writer"]
    assert violations("kilolock.tfstate.parse", "def f():\n    from kilolock import tfstate\n") == [
        "kilolock.tfstate.parse imports kilolock.tfstate"]
    assert violations("kilolock.tfstate.writer", "from kilolock.tfstate.parse import is_encrypted_envelope") == []
    # The provider layer may use the extension's transport and P-256, each where it is permitted,
    # never its codec.
    assert violations("kilolock.provider.h2channel", "from kilolock._native import transport") == []
    assert violations("kilolock.provider.certs", "from kilolock._native import p256") == []
    assert violations("kilolock.provider.h2channel", "from kilolock._native import codec") == [
        "kilolock.provider.h2channel imports kilolock._native.codec"]
    assert violations("kilolock.provider.certs", "from kilolock._native import transport") == [
        "kilolock.provider.certs imports kilolock._native.transport"]


# No circles: whatever the layers allow, no kilolock module may reach itself through its imports
# (lazy ones and those for type checking count too: a circle that only a function-level import
# keeps from failing at import time still ties the modules together). The rule for packages:
# `from P import x` is an arrow to the module P.x when x is a submodule; otherwise to the module
# P's __init__ took x from when it re-exports x, and to P itself only for what P's __init__
# defines. So an __init__ that re-exports its submodules (and importing P.x runs it first) makes
# no circle with them; one that defines what its submodules import is a module like any other.
Graph = dict[str, set[str]]


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that bind a module's own names: its body, and what if and try blocks hold."""
    out: list[ast.stmt] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            todo.extend([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
    return out


def _from_names(source: str, module: str, is_package: bool,
                module_level: bool = False) -> list[tuple[str, list[tuple[str, str]]]]:
    """(base, [(name, bound as)]) for each `from BASE import ...` (relative ones resolved), and
    `import a.b` as (a.b, []): at any depth, or (module_level) only those that bind the module's names."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[str, list[tuple[str, str]]]] = []
    tree = ast.parse(source)
    for node in _module_level(tree) if module_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [(a.name, a.asname or a.name) for a in node.names]))
    return out


def import_graph(sources: dict[str, tuple[str, bool]]) -> Graph:
    """Module → the kilolock modules it imports, from {module: (source, is a package)}."""
    imports = {m: _from_names(src, m, pkg) for m, (src, pkg) in sources.items()}
    # What each package's __init__ hands on: bound name → the module it took that name from.
    handed: dict[str, dict[str, str]] = {p: {} for p, (_, pkg) in sources.items() if pkg}
    for pkg, names in handed.items():
        for base, taken in _from_names(sources[pkg][0], pkg, True, module_level=True):
            for name, bound in taken:
                names[bound] = f"{base}.{name}" if f"{base}.{name}" in sources else base

    def target(base: str, name: str) -> str:
        seen: set[str] = set()
        while f"{base}.{name}" not in sources and name in handed.get(base, {}) and base not in seen:
            seen.add(base)
            base = handed[base][name]
        return f"{base}.{name}" if f"{base}.{name}" in sources else base

    graph: Graph = {}
    for module, found in imports.items():
        arrows = {target(base, name) for base, taken in found for name, _ in taken}
        arrows |= {base for base, taken in found if not taken}
        graph[module] = {m for m in arrows if m in sources and m != module}
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, arrows = work[-1]
            step = next(arrows, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _describe(graph: Graph, circle: list[str]) -> str:
    members = set(circle)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in circle)


def test_no_import_circles() -> None:
    graph = import_graph({name: (path.read_text(encoding="utf-8"), path.name == "__init__.py") for name, path in _modules()})
    found = [_describe(graph, c) for c in circles(graph)]
    assert not found, ("kilolock modules that import each other in a circle (move what they share into a module "
                       "below both):\n" + "\n".join(found))


def test_the_rule_catches_a_circle() -> None:
    # Lazy and type-checking imports count; a circle names every module in it.
    lazy = import_graph({
        "kilolock.a": ("", True),
        "kilolock.a.x": ("from kilolock.a import y\n", False),
        "kilolock.a.y": ("def f():\n    from kilolock.a.z import g\n", False),
        "kilolock.a.z": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kilolock.a.x import T\n", False),
    })
    assert circles(lazy) == [["kilolock.a.x", "kilolock.a.y", "kilolock.a.z"]]
    assert _describe(lazy, circles(lazy)[0]) == ("kilolock.a.x -> kilolock.a.y; kilolock.a.y -> kilolock.a.z; "
                                                 "kilolock.a.z -> kilolock.a.x")
    # An __init__ that re-exports its submodules makes no circle with them, also when a submodule
    # takes a sibling's name through it ...
    face = import_graph({
        "kilolock.p": ("from kilolock.p.a import A\nfrom kilolock.p.b import B\n", True),
        "kilolock.p.a": ("from kilolock.p import B, b\n", False),
        "kilolock.p.b": ("B = 1\n", False),
    })
    assert circles(face) == [] and face["kilolock.p.a"] == {"kilolock.p.b"}
    # ... but one whose submodule takes what the __init__ itself defines is in a circle with it.
    owner = import_graph({
        "kilolock.p": ("from kilolock.p.a import A\ndef helper(): ...\n", True),
        "kilolock.p.a": ("from kilolock.p import helper\n", False),
    })
    assert circles(owner) == [["kilolock.p", "kilolock.p.a"]]


def test_the_fleet_sits_above_the_refresh_of_one_state() -> None:
    # The fleet runtime is a part of its own: it refreshes through kilolock.refresh, which never
    # reaches back for the worker, its warm pool or --all; the CLI starts both.
    assert (PACKAGE / "fleet" / "worker.py").exists() and not (PACKAGE / "refresh" / "fleet.py").exists()
    assert violations("kilolock.fleet.worker", "from kilolock.refresh.service import refresh_or_fail") == []
    assert violations("kilolock.fleet.warm", "from kilolock.provider import launch_provider") == []
    assert violations("kilolock.cli.workercmd", "from kilolock.fleet.worker import Worker") == []
    assert violations("kilolock.refresh.service", "from kilolock.fleet import warm") == [
        "kilolock.refresh.service imports kilolock.fleet"]
    assert violations("kilolock.fleet.worker", "from kilolock.server import http") == [
        "kilolock.fleet.worker imports kilolock.server"]


# One open path: the refresh factory asks a source for a process (kilolock.refresh.sources: launch,
# take one started early; the fleet's warm pool is a source too) and does the rest itself. Only the
# sources, and prelaunch that starts processes early, reach for the provider layer's launches.
LAUNCHES = {"kilolock.provider.launch", "kilolock.provider.launch_provider"}
MAY_LAUNCH = {"kilolock.refresh.sources", "kilolock.refresh.prelaunch"}


def launch_imports(module: str, source: str) -> list[str]:
    if unit_of(module) == "kilolock.provider" or module in MAY_LAUNCH:
        return []
    return [f"{module} imports {t}" for t in sorted(_imported_names(source, module) & LAUNCHES)]


def test_providers_are_started_by_the_factorys_sources_only() -> None:
    found = [v for name, path in _modules() for v in launch_imports(name, path.read_text(encoding="utf-8"))]
    assert not found, ("a provider is started by a source of kilolock.refresh.factory (refresh/sources.py, or a "
                       "ProcessSource like the fleet's warm pool):\n" + "\n".join(found))
    assert launch_imports("kilolock.fleet.warm", "from kilolock.provider import launch_provider") == [
        "kilolock.fleet.warm imports kilolock.provider.launch_provider"]
    assert launch_imports("kilolock.refresh.factory", "from kilolock.provider.launch import launch_provider") == [
        "kilolock.refresh.factory imports kilolock.provider.launch"]
    assert launch_imports("kilolock.fleet.warm", "from kilolock.refresh.sources import launch") == []


def sql_calls(source: str) -> list[int]:
    """Lines that talk to the database directly: a psycopg execute, cursor or COPY."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"execute", "executemany", "cursor", "copy"}]


def test_sql_lives_in_store() -> None:
    found = [f"{path.relative_to(REPO)}:{line}" for name, path in _modules() if unit_of(name) != "kilolock.store"
             for line in sql_calls(path.read_text(encoding="utf-8"))]
    assert not found, "database calls outside kilolock/store/ (add a store function instead):\n" + "\n".join(found)
    assert sql_calls("with conn.cursor() as cur:\n    cur.execute('SELECT 1')\n") == [1, 2]


# A command opens the store through the CommandContext it is handed (kilolock.cli.commands), never
# through kilolock.store.db directly: what kl does after the command (send the notifications it
# wrote, name the closest state on a mistyped one) is told by the context, and would skip a store
# the context never saw opened.
def store_openings(source: str) -> list[int]:
    """Lines that open the store other than through a command's context."""
    def direct(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):  # db.open_store, not context.open_store
            return node.attr == "open_store" and not (isinstance(node.value, ast.Name) and node.value.id == "context")
        return isinstance(node, ast.ImportFrom) and any(a.name == "open_store" for a in node.names)

    return sorted(getattr(node, "lineno", 0) for node in ast.walk(ast.parse(source)) if direct(node))


def test_commands_open_the_store_through_their_context() -> None:
    found = [f"{path.relative_to(REPO)}:{line}" for name, path in _modules()
             if unit_of(name) == "kilolock.cli" and name != "kilolock.cli.commands"
             for line in store_openings(path.read_text(encoding="utf-8"))]
    assert not found, "commands open the store with context.open_store() (kilolock.cli.commands.CommandContext):\n" + "\n".join(found)
    assert store_openings("with db.open_store() as conn:\n    pass\nfrom kilolock.store.db import open_store\n") == [1, 3]
    assert store_openings("with context.open_store() as conn:\n    pass\n") == []


# The web UI (kilolock/server/ui) is a reader: of the store it sees the read modules only, so no
# page can write, lock or refresh; and only the HTTP router reaches it. A module that holds any
# write (store/writes.py, or states.py's row lock and delete) is not listed, even for a name it
# exports: what the UI catches lives in errors.py for that reason.
UI = "kilolock.server.ui"
UI_STORE_READS = {"kilolock.store.ui_queries", "kilolock.store.history", "kilolock.store.errors", "kilolock.store.db"}


def _imported_names(source: str, module: str) -> set[str]:
    """imported_modules, plus each name a `from X import name` takes (a submodule or not)."""
    package = module if module.endswith("__init__") else module.rpartition(".")[0]
    found = set(imported_modules(source, module))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{a.name}" for a in node.names if base.startswith("kilolock"))
    return found


def ui_violations(module: str, source: str) -> list[str]:
    found = _imported_names(source, module)
    if module == UI or module.startswith(UI + "."):
        return [f"{module} imports {t}" for t in sorted(found)
                if unit_of(t) == "kilolock.store" and t != "kilolock.store"
                and not any(t == r or t.startswith(r + ".") for r in UI_STORE_READS)]
    if module != "kilolock.server.http":
        return [f"{module} imports {t}" for t in sorted(found) if t == UI or t.startswith(UI + ".")]
    return []


def test_the_web_ui_only_reads() -> None:
    found = [v for name, path in _modules() for v in ui_violations(name, path.read_text(encoding="utf-8"))]
    assert not found, ("the web UI reads through store/ui_queries.py (and history; errors for what it catches); only "
                       "server/http.py routes to it:\n" + "\n".join(found))
    assert ui_violations("kilolock.server.ui.pages", "from kilolock.store import locks") == [
        "kilolock.server.ui.pages imports kilolock.store.locks"]
    assert ui_violations("kilolock.server.ui.pages", "from kilolock.store import ui_queries") == []
    assert ui_violations("kilolock.server.ui.pages", "from kilolock.store.errors import StateNotFound") == []
    # The write path, and the states table's row lock and delete, are no reads, whatever name is taken from them.
    assert ui_violations("kilolock.server.ui", "from kilolock.store.writes import WriteResult") == [
        "kilolock.server.ui imports kilolock.store.writes", "kilolock.server.ui imports kilolock.store.writes.WriteResult"]
    assert ui_violations("kilolock.server.ui.pages", "from kilolock.store import states, versions") == [
        "kilolock.server.ui.pages imports kilolock.store.states", "kilolock.server.ui.pages imports kilolock.store.versions"]
    assert ui_violations("kilolock.server.backend", "from kilolock.server.ui import pages") == [
        "kilolock.server.backend imports kilolock.server.ui", "kilolock.server.backend imports kilolock.server.ui.pages"]


# Past this a module holds more than one job (it was the mark of every split so far: tfstate,
# versions, the orchestrator, notify's deliveries); the limit is the module's, not a formatter's.
MODULE_LINE_LIMIT = 600


def test_no_module_is_over_the_line_limit() -> None:
    too_long = {str(path.relative_to(REPO)): n for path in sorted(PACKAGE.rglob("*.py"))
                if (n := len(path.read_text().splitlines())) > MODULE_LINE_LIMIT}
    assert not too_long, f"split these by job (limit {MODULE_LINE_LIMIT} lines): {too_long}"
