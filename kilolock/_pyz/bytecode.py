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
from importlib.util import MAGIC_NUMBER
from types import CodeType


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


def install(archive_path: str, code_dir: str) -> None:
    """From now on, modules under ``archive_path`` load through the cache in ``code_dir``."""
    try:
        os.makedirs(code_dir, exist_ok=True)
    except OSError:
        return  # e.g. a read-only pre-extracted cache: imports fall back to plain zipimport
    CachingZipImporter.code_dir = code_dir
    archive = os.path.abspath(archive_path)

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
