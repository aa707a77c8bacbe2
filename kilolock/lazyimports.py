"""Modules a kl process imports but does not use, imported only when first used.

Other libraries import them at their top for paths kl never takes: protobuf's descriptor pool
imports its pure-Python message implementation (and text_format, the decoder, pickle, calendar
with it) though kl runs protobuf's upb backend; dataclasses and linecache import copy and tokenize
for asdict and for reading source files into a traceback. Together ~10 ms of CPU before a small
refresh's first read, most of it on the thread that connects the provider while the main thread
imports psycopg, with which it shares one GIL.

``own_process`` makes importing each give a placeholder module: the import system files it as
usual (sys.modules, its package's attribute), and the module's own code runs into it at the first
attribute anyone reads, so every use still gets the real module, the same object. Nothing is
imported ahead of being asked for (`kl version` imports no protobuf). Only kl's entry points call
it (`kl`, ``python -m kilolock``, kl.pyz), before anything else is imported; a module already
imported is left as it is. Each module here is a leaf of the standard library or protobuf whose
own imports never come back to it: a thread that uses one while another loads it waits on that
module's lock alone, which the import system's own locks never wait for.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from importlib.machinery import ModuleSpec

UNUSED = (
    "google.protobuf.internal.python_message",
    "copy",
    "tokenize",
)

_LOCKS: dict[str, threading.RLock] = {}  # one per deferred module: its code runs once, whichever thread asks
_LOADING: set[str] = set()


class _Deferred(types.ModuleType):
    """A module whose code has not run yet: the first attribute read that misses runs it. Other
    threads that ask meanwhile wait for it to finish, as an import would make them."""

    def __getattr__(self, attr: str) -> object:
        if attr == "__path__":  # the import system asks while it files the module: none, as a module has none
            raise AttributeError(attr)
        name = self.__name__
        with _LOCKS[name]:
            if name in _LOADING:  # its own code, or what that imports, asked: as from a module half imported
                raise AttributeError(f"partially initialized module {name!r} has no attribute {attr!r}")
            if type(self) is _Deferred:  # not loaded by another thread meanwhile
                spec = self.__spec__
                assert spec is not None and isinstance(spec.loader, _DeferringLoader)
                spec.loader = self.__loader__ = spec.loader.real
                _LOADING.add(name)
                try:
                    spec.loader.exec_module(self)
                except BaseException:
                    sys.modules.pop(name, None)  # as a failed import leaves it: the next import tries again
                    raise
                finally:
                    _LOADING.discard(name)
                self.__class__ = types.ModuleType  # a plain module from now on, the same object
        return getattr(self, attr)


class _DeferringLoader:
    """Wraps the loader that would have run the module: makes the placeholder, runs nothing."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        _LOCKS.setdefault(spec.name, threading.RLock())
        module = _Deferred(spec.name)
        # What the import system looks for before it sets them (getattr with a default): present
        # now, that look does not run the module.
        if spec.has_location and spec.origin:
            module.__file__ = spec.origin
            module.__cached__ = spec.cached  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # at the first attribute read (_Deferred)


class _DeferringFinder:
    """First on sys.meta_path: for a name it defers, the spec the other finders give, its loader
    wrapped. Everything else an import does (sys.modules, the parent's attribute, __spec__,
    __file__) is the import system's own, so nothing is imported before it is asked for."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = set(names)

    def find_spec(self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None) -> ModuleSpec | None:
        if name not in self.names:
            return None
        self.names.discard(name)  # once: a failed or reloaded import takes the usual way
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and spec.submodule_search_locations is None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _DeferringLoader(spec.loader)  # type: ignore[assignment]
                return spec  # a package, or a loader of the old kind: as found
        return None


def install(names: Iterable[str]) -> None:
    """Defer NAMES (modules, not packages) that are not imported yet."""
    sys.meta_path.insert(0, _DeferringFinder(n for n in names if n not in sys.modules))


def deferred(name: str) -> bool:
    """Whether NAME is imported as a placeholder whose code has not run."""
    return type(sys.modules.get(name)) is _Deferred


def own_process() -> None:
    """Defer UNUSED in this process (kl's entry points, before anything else is imported)."""
    install(UNUSED)
