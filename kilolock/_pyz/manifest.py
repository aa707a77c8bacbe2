"""What build_zipapp.py recorded in ``kl-pyz.json`` at the root of the zip, and which of its native
files belong to the running interpreter."""
from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from typing import Any, NamedTuple

from kilolock._pyz.layout import MANIFEST_NAME

__all__ = ["MANIFEST_NAME", "NATIVE_PREFIX", "Manifest", "NativeFile", "parse", "running_on", "select"]
NATIVE_PREFIX = "native/"


class NativeFile(NamedTuple):
    path: str  # relative to the wheel root, e.g. grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so
    dist: str
    module: str | None  # dotted name for an extension module; None for a shared library
    size: int
    sha256: str


class Manifest(NamedTuple):
    build_id: str
    kilolock_version: str
    platform: str
    machine: str
    pythons: list[str]
    dists: dict[str, dict[str, Any]]
    natives: list[NativeFile]

    def built_for(self) -> str:
        return f"CPython {', '.join(self.pythons)} on {self.platform}"


def parse(raw: bytes) -> Manifest:
    doc = json.loads(raw)
    natives = [NativeFile(n["path"], n["dist"], n["module"], n["size"], n["sha256"]) for n in doc["natives"]]
    return Manifest(doc["build_id"], doc["kilolock_version"], doc["platform"], doc["machine"],
                    list(doc["pythons"]), dict(doc["dists"]), natives)


def running_on() -> str:
    import platform

    return f"CPython {platform.python_version()} on {sys.platform} {platform.machine()}"


def _machine_matches(manifest: Manifest) -> bool:
    here = os.uname().machine.lower()
    aliases = {"amd64": "x86_64", "arm64": "aarch64"}
    return sys.platform.startswith("linux") and aliases.get(here, here) == manifest.machine


def select(manifest: Manifest) -> list[NativeFile]:
    """The native files this interpreter can load: for each extension module the file with the
    most specific suffix it accepts (cpython-3XX before abi3), plus the shared libraries of the
    distributions those modules come from. Empty on another machine type or OS."""
    if not _machine_matches(manifest):
        return []
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    best: dict[str, tuple[int, NativeFile]] = {}
    for n in manifest.natives:
        if n.module is None:
            continue
        base = n.path.rsplit("/", 1)[-1]
        stem = n.module.rsplit(".", 1)[-1]
        for rank, suffix in enumerate(suffixes):
            if base == stem + suffix:
                if n.module not in best or rank < best[n.module][0]:
                    best[n.module] = (rank, n)
                break
    chosen = [n for _, n in best.values()]
    dists = {n.dist for n in chosen}
    chosen += [n for n in manifest.natives if n.module is None and n.dist in dists]
    return sorted(chosen, key=lambda n: n.path)
