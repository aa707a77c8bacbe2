"""The zip's ``__main__``: find or make the extraction, install the import hooks, run ``kl``."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

from kilolock._pyz import bytecode, cache, manifest
from kilolock._pyz.finder import NativeFinder, install

_finder: NativeFinder | None = None
_manifest: manifest.Manifest | None = None


def build_id() -> str:
    return _manifest.build_id[:16] if _manifest else "source"


def cache_dir_description() -> str:
    """For ``kl version``: the extraction in use, or where one would have gone."""
    if _finder is None or _manifest is None:
        return "-"
    if _finder.extracted_dir is not None:
        return _finder.extracted_dir
    return f"{os.path.join(cache.planned_root(), cache.unit_name(_manifest))} (unavailable)"


def main(archive_path: str) -> NoReturn:
    global _finder, _manifest
    from kilolock import lazyimports

    lazyimports.own_process()  # first: the code cache below already imports dataclasses (and with it copy)
    # Read through the zipimporter that loaded this module: it has already parsed the zip's
    # directory, so the warm path never imports zipfile.
    raw = __loader__.get_data(os.path.join(archive_path, manifest.MANIFEST_NAME))  # type: ignore[name-defined]
    _manifest = manifest.parse(raw)
    _finder = install(os.path.abspath(archive_path), _manifest)
    extracted = _finder.prepare()
    if extracted is not None:
        bytecode.install(archive_path, os.path.join(extracted, "__pycache__"))
    os.environ["KL_BUILD_ID"] = build_id()
    from kilolock.cli import run_process

    sys.argv[0] = os.path.basename(archive_path)
    run_process(sys.argv[1:])
