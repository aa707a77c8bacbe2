"""The import hook for native modules inside kl.pyz.

Pure-Python modules import straight from the zip. For a native module name (grpc._cython.cygrpc,
psycopg_binary.pq, google._upb._message, kilolock._native) this finder extracts the interpreter's
files on first use and hands Python the extracted path. Failures are ``NativeLoadError``: an
ImportError (so optional natives fall back: the codec to pure Python, protobuf to its Python
implementation) and a KlError (so a required one reaches the user as one line, not a traceback).
"""
from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from kilolock._pyz import cache
from kilolock._pyz.manifest import Manifest, NativeFile, running_on, select
from kilolock.errors import KlError


class NativeLoadError(ImportError, KlError):
    pass


class _Loader(importlib.machinery.ExtensionFileLoader):
    def __init__(self, fullname: str, path: str, finder: NativeFinder) -> None:
        super().__init__(fullname, path)
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        try:
            return super().create_module(spec)
        except ImportError as exc:  # dlopen failed: wrong libc, missing system library, ...
            raise self._finder.error(spec.name, str(exc)) from None


class NativeFinder:
    """A meta path finder (see importlib.abc.MetaPathFinder) that knows the pyz's native modules."""

    def __init__(self, archive_path: str, manifest: Manifest) -> None:
        self._archive_path = archive_path
        self._manifest = manifest
        self._wanted: list[NativeFile] = select(manifest)
        self._mine = {n.module: n for n in self._wanted if n.module}
        self._all_modules = {n.module: n.dist for n in manifest.natives if n.module}
        # A required distribution is checked when its package is first imported, before a
        # library's own fallback (psycopg trying a system libpq) can blur the message.
        self._gates: dict[str, str] = {}
        for dist, info in manifest.dists.items():
            if info.get("required"):
                for gate in info.get("gates", []):
                    self._gates[gate] = dist
        self._dir: str | None = None
        self._unavailable: str | None = None

    @property
    def extracted_dir(self) -> str | None:
        return self._dir

    def error(self, module: str, reason: str) -> NativeLoadError:
        dist = self._all_modules.get(module) or self._gates.get(module, module)
        version = self._manifest.dists.get(dist, {}).get("version", "?")
        return NativeLoadError(
            f"cannot load {dist} {version} ({module}) from kl.pyz: {reason}; this kl.pyz was built for "
            f"{self._manifest.built_for()}, and this is {running_on()}",
            name=module,
        )

    def prepare(self) -> str | None:
        """Find or make this interpreter's extraction; None (with the reason kept) if impossible."""
        if self._dir is None and self._unavailable is None:
            try:
                self._dir = cache.ensure_extracted(self._archive_path, self._manifest, self._wanted)
            except cache.CacheUnavailable as exc:
                self._unavailable = str(exc)
            except OSError as exc:
                self._unavailable = f"extraction failed: {exc}"
        return self._dir

    def _directory(self, module: str) -> str:
        found = self.prepare()
        if found is None:
            raise self.error(module, self._unavailable or "not extracted")
        return found

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> ModuleSpec | None:
        dist = self._gates.get(fullname)
        if dist is not None:
            if not any(n.dist == dist for n in self._wanted):
                raise self.error(fullname, "no build of it for this interpreter")
            self._directory(fullname)  # cannot extract: say so now, not after a library's fallbacks
        native = self._mine.get(fullname)
        if native is None:
            if fullname in self._all_modules:
                raise self.error(fullname, "no build of it for this interpreter")
            return None
        location = os.path.join(self._directory(fullname), native.path)
        spec = ModuleSpec(fullname, _Loader(fullname, location, self), origin=location)
        spec.has_location = True
        return spec

    def invalidate_caches(self) -> None:
        pass


def install(archive_path: str, manifest: Manifest) -> NativeFinder:
    finder = NativeFinder(archive_path, manifest)
    sys.meta_path.insert(0, finder)
    return finder
