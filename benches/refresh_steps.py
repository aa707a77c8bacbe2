"""Where a small `kl refresh` spends its time: run the real kl.pyz (or the source tree) in one
process with a tracer that timestamps each step, and print the timeline as JSON.

    python3 -I benches/refresh_steps.py KL_PYZ_OR_REPO -- refresh STATE [flags]

The tracer is an import hook: it times the first import of the heavy packages (psycopg, grpc,
protobuf and the generated stubs) and, once kl's own modules are loaded, wraps the functions that
make up the steps (connect, provider launch, channel, AutoMTLS probe, schema, configure, reads,
commit).
Nothing in kl changes; the figures are wall-clock seconds since the tracer started (`t`, the
interpreter's own start-up is the gap before it, measured by the caller). Imports that happen
inside a wrapped step are counted in both, as they really delay that step.

Only the standard library: it runs under the same bare interpreter as kl.pyz.
"""
from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

T0 = time.monotonic()
EVENTS: list[tuple[str, float, float]] = []  # (step, start, end) in seconds since T0
_lock = threading.Lock()

# Top-level imports worth a line of their own: the first import of each is timed.
IMPORTS = {
    "psycopg": "import psycopg",
    "grpc": "import grpc",
    "google.protobuf": "import protobuf",
    "kilolock.provider._pb.tfplugin5_pb2": "import protocol stubs",
    "kilolock.provider._pb.tfplugin6_pb2": "import protocol stubs",
    "kilolock.cli": "import kilolock.cli",
}


def _record(step: str, start: float, end: float) -> None:
    with _lock:
        EVENTS.append((step, start - T0, end - T0))


def _timed(step: str, fn: Callable[..., Any], *, once: bool = False) -> Callable[..., Any]:
    done = [False]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            if not (once and done[0]):
                done[0] = True
                _record(step, start, time.monotonic())

    return wrapper


def _timed_async(step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return await fn(*args, **kwargs)
        finally:
            _record(step, start, time.monotonic())

    return wrapper


def _wrap(obj: Any, attr: str, step: str) -> None:
    fn = getattr(obj, attr, None)
    if fn is not None:
        setattr(obj, attr, _timed(step, fn))


def _patch_db(m: ModuleType) -> None:
    _wrap(m, "connect", "db connect")
    _wrap(m, "open_store", "open store (connect + schema check)")


def _patch_process(m: ModuleType) -> None:
    cls = m.PluginProcess
    cls.start = classmethod(_timed("provider launch (spawn to handshake line)", cls.start.__func__))
    if hasattr(cls, "spawn"):  # kl that spawns first and waits for the handshake later
        cls.spawn = classmethod(_timed("provider spawn", cls.spawn.__func__))
        _wrap(cls, "wait_for_handshake", "provider handshake wait")


def _patch_connection(m: ModuleType) -> None:
    # kl before the provider transport (session 10) made its grpc channel here: the same step, so
    # traces of the code before and after line up (grpcio connects at the first call, the probe).
    _wrap(m, "_open_channel", "channel connect (TLS for the native client)")
    _wrap(m, "_probe", "AutoMTLS / first call (health probe)")
    _wrap(m.PluginConnection, "close", "provider close (Shutdown, exit, reap)")


def _patch_transport(m: ModuleType) -> None:
    # The connection calls it through the module (transport.open_channel), so this wrapper is seen.
    _wrap(m, "open_channel", "channel connect (TLS for the native client)")


def _patch_certs(m: ModuleType) -> None:
    _wrap(m, "generate_client_certificate", "AutoMTLS client certificate")


def _patch_factory(m: ModuleType) -> None:
    _wrap(m.ProviderFactory, "_schema", "schema (cached or fetched)")
    _wrap(m.ProviderFactory, "_configure", "validate + configure")
    _wrap(m.ProviderFactory, "open", "factory open (discover .. configure)")


def _patch_orchestrator(m: ModuleType) -> None:
    _wrap(m, "_refresh_one", "read")  # one event per instance: the caller spans first to last
    if hasattr(m, "_refresh_one_async"):  # reads from the event loop (from 5 instances since session 10)
        setattr(m, "_refresh_one_async", _timed_async("read", getattr(m, "_refresh_one_async")))  # noqa: B009, B010
    _wrap(m, "commit_refresh", "commit")
    # A refresh without --commit records an observation instead (from the observations change): the
    # same step, its write of what it read, so traces before and after line up.
    _wrap(m, "record_observation", "commit")
    _wrap(m, "_finish", "finish audit row")
    _wrap(m, "run", "orchestrator run")


def _patch_reads(m: ModuleType) -> None:
    # Since the orchestrator's split the reads call one instance's read from refresh/reads.py.
    _wrap(m, "refresh_instance", "read")  # one event per instance: the caller spans first to last
    if hasattr(m, "refresh_instance_async"):
        setattr(m, "refresh_instance_async", _timed_async("read", getattr(m, "refresh_instance_async")))  # noqa: B009, B010


def _patch_refreshcmd(m: ModuleType) -> None:
    _wrap(m, "run", "refresh command")
    _wrap(m, "drift_counts", "drift counts")


def _patch_cli(m: ModuleType) -> None:
    _wrap(m, "_send_notifications", "notifications after the command")


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "kilolock.store.db": _patch_db,
    "kilolock.provider.process": _patch_process,
    "kilolock.provider.transport": _patch_transport,
    "kilolock.provider.connection": _patch_connection,
    "kilolock.provider.certs": _patch_certs,
    "kilolock.refresh.factory": _patch_factory,
    "kilolock.refresh.orchestrator": _patch_orchestrator,
    "kilolock.refresh.reads": _patch_reads,
    "kilolock.cli.refreshcmd": _patch_refreshcmd,
    "kilolock.cli": _patch_cli,
}


class _TimedLoader(importlib.abc.Loader):
    """One module's loader, timed; everything else is the real loader's (zipimport's, say)."""

    def __init__(self, inner: Any, fullname: str) -> None:
        self._inner = inner
        self._fullname = fullname

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        start = time.monotonic()
        self._inner.exec_module(module)
        if self._fullname in IMPORTS:
            _record(IMPORTS[self._fullname], start, time.monotonic())
        if self._fullname in PATCHES:
            PATCHES[self._fullname](module)


class _Tracer(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> Any:
        if fullname not in IMPORTS and fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _TimedLoader(spec.loader, fullname)
        return spec


def _dump() -> None:
    import json  # here, not at the top: kl imports it at its own moment

    out = os.environ.get("KL_STEPS_OUT")
    # CPU seconds of kl's own process, every thread, from the interpreter's start (the provider's
    # are its own): under load the steadier measure of what kl itself costs.
    doc = {"t0_monotonic": T0, "events": EVENTS, "exit": time.monotonic() - T0, "cpu": time.process_time()}
    if out:
        with open(out, "w") as fh:
            json.dump(doc, fh)


def main(argv: list[str]) -> None:
    target, sep, args = argv[0], argv[1], argv[2:]
    assert sep == "--", "usage: refresh_steps.py KL_PYZ_OR_REPO -- ARGS"
    sys.meta_path.insert(0, _Tracer())
    atexit.register(_dump)
    if target.endswith(".pyz"):
        import runpy

        sys.argv = [target, *args]
        sys.path.insert(0, target)
        runpy.run_path(target, run_name="__main__")
    else:
        sys.path.insert(0, target)
        from kilolock.cli import main as kl_main

        sys.exit(kl_main(args))


if __name__ == "__main__":
    main(sys.argv[1:])
