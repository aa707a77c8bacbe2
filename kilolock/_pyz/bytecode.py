"""Compiled-code cache for the modules imported from kl.pyz.

zipimport compiles every module's source on every run (it never writes bytecode, and one zip cannot
hold .pyc files for four interpreter versions). This importer keeps the compiled code of each module
in the extraction dir, which is already private to one build and one interpreter ABI, so a cached
entry never needs a staleness check beyond the interpreter's magic number.
"""
from __future__ import annotations

import marshal
import os
import sys
import zipimport
from collections.abc import Mapping
from importlib.util import MAGIC_NUMBER
from types import CodeType
from typing import Any


class CachingZipImporter(zipimport.zipimporter):
    code_dir: str = ""

    def get_filename(self, fullname: str) -> str:
        # zipimport works the file name out by compiling the module, and asks for it while
        # finding it, so every import compiled twice; our zip holds sources only, so the name is
        # known without that.
        # The zip's table of contents is private (an attribute up to 3.12, a method from 3.13):
        # any surprise falls back to zipimport's own way.
        try:
            files = getattr(self, "_files", None)
            if files is None:
                files = self._get_files()  # type: ignore[attr-defined]
            ispkg = self.is_package(fullname)
            inner = self.prefix + fullname.rpartition(".")[2] + ("/__init__.py" if ispkg else ".py")
            if inner in files:
                return os.path.join(self.archive, inner)
        except Exception:  # noqa: BLE001, S110 - any failure means: let zipimport answer as it would
            pass
        return super().get_filename(fullname)

    def get_code(self, fullname: str) -> CodeType:
        path = os.path.join(self.code_dir, fullname + ".pyc")
        try:
            with open(path, "rb") as fh:
                data = fh.read()
            if data[:4] == MAGIC_NUMBER:
                code = marshal.loads(memoryview(data)[4:])
                if isinstance(code, CodeType):
                    return code
        except (OSError, ValueError, EOFError, TypeError):
            pass  # missing or damaged: compile again and rewrite it
        code = super().get_code(fullname)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(MAGIC_NUMBER + marshal.dumps(code))
            os.replace(tmp, path)
        except OSError:  # a read-only cache still works, only slower
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return code


class GeneratedCodeCache:
    """Compiled code of the methods ``dataclasses`` and ``namedtuple`` write at import time.

    Both generate Python source for each class (a frozen dataclass: six functions) and ``exec``
    it; compiling that is most of what importing a module of dataclasses costs (kilolock.schema:
    16 ms of 17 on a 2-core CI box), every run. The source text fully determines the code, so the
    code is kept here, keyed by the text, in one file of the extraction dir (private to this build
    and interpreter ABI), read once at start and rewritten at exit when something new was compiled.
    A missing or damaged file means compiling as usual.
    """

    FILE = "generated-code.marshal"

    def __init__(self, code_dir: str) -> None:
        self.path = os.path.join(code_dir, self.FILE)
        self.codes: dict[str, CodeType] = {}
        self.new = False
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
            if data[:4] == MAGIC_NUMBER:
                loaded = marshal.loads(memoryview(data)[4:])
                if isinstance(loaded, dict):
                    self.codes = {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, CodeType)}
        except (OSError, ValueError, EOFError, TypeError):
            pass

    def exec(self, source: str | bytes | CodeType, globals: dict[str, Any] | None = None,
             locals: Mapping[str, object] | None = None) -> None:
        if isinstance(source, str):
            code = self.codes.get(source)
            if code is None:
                # dont_inherit: compiled as the generating module would, not with this module's
                # __future__ flags (dataclasses and collections have none).
                code = self.codes[source] = compile(source, "<string>", "exec", dont_inherit=True)
                self.new = True
            source = code
        exec(source, globals, locals)  # noqa: S102 - the generated class methods, as the stdlib would

    def save(self) -> None:
        if not self.new:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(MAGIC_NUMBER + marshal.dumps(self.codes))
            os.replace(tmp, self.path)
        except (OSError, ValueError):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _cache_generated_code(code_dir: str) -> None:
    """Route the stdlib's class generators through a GeneratedCodeCache. Both call ``exec`` by its
    global name (3.10 to 3.13), so a module attribute of that name takes the call; elsewhere it
    is never looked up and nothing changes."""
    import atexit
    import collections
    import dataclasses

    cache = GeneratedCodeCache(code_dir)
    dataclasses.exec = cache.exec  # type: ignore[attr-defined]
    collections.exec = cache.exec  # type: ignore[attr-defined]
    atexit.register(cache.save)


_hooked: set[str] = set()  # archives whose modules already load through CachingZipImporter


def _hook(archive_path: str) -> None:
    """Modules under ``archive_path`` load through CachingZipImporter from now on, those of
    packages already imported too (their cached zipimporters are dropped)."""
    archive = os.path.abspath(archive_path)
    if archive in _hooked:
        return

    def hook(path: str) -> zipimport.zipimporter:
        full = os.path.abspath(path)
        if full == archive or full.startswith(archive + os.sep):
            return CachingZipImporter(path)
        raise ImportError("not inside kl.pyz")

    sys.path_hooks.insert(0, hook)
    for entry in list(sys.path_importer_cache):
        full = os.path.abspath(entry)
        if full == archive or full.startswith(archive + os.sep):
            del sys.path_importer_cache[entry]
    _hooked.add(archive)


def install_early(archive_path: str, loader: Any) -> None:
    """Called by the zip's ``__main__`` before anything else of kilolock: when this build's
    extraction dir already holds compiled code, the rest of the start-up code (entry, cache,
    manifest, finder) loads from it too. Without this, zipimport compiled each of those modules
    from source on every run, twice (once to name its file, once to run it): 8-12 ms of every
    command. Only the roots the environment names are looked at (the temp-dir fallback needs
    tempfile); anything missing or unreadable leaves it to ``install``, after extraction."""
    import json

    from kilolock._pyz.layout import MANIFEST_NAME, candidate_roots, unit_name_of

    try:
        build_id = json.loads(loader.get_data(os.path.join(archive_path, MANIFEST_NAME)))["build_id"]
    except Exception:  # noqa: BLE001 - any surprise: the start goes on as without the early cache
        return
    if not isinstance(build_id, str):
        return
    for root, _ in candidate_roots(temp=False):
        code_dir = os.path.join(root, unit_name_of(build_id), "__pycache__")
        if os.path.isdir(code_dir):
            CachingZipImporter.code_dir = code_dir
            _hook(archive_path)
            return


def install(archive_path: str, code_dir: str) -> None:
    """From now on, modules under ``archive_path`` load through the cache in ``code_dir`` (the
    extraction found or made: it replaces what install_early guessed)."""
    try:
        os.makedirs(code_dir, exist_ok=True)
    except OSError:
        return  # e.g. a read-only pre-extracted cache: imports fall back to plain zipimport
    _cache_generated_code(code_dir)
    CachingZipImporter.code_dir = code_dir
    _hook(archive_path)
