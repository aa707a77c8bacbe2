"""Where kl.pyz keeps things, for the first modules that run: the manifest's name in the zip, the
roots a cache dir may live under and the name of one build's dir there. Only ``os`` and
``importlib.machinery`` (both loaded before any of kl): this module is imported before the
compiled-code cache is in place (bytecode.install_early), so it is compiled on every run."""
from __future__ import annotations

import importlib.machinery
import os
from collections.abc import Iterator

MANIFEST_NAME = "kl-pyz.json"


def abi_tag() -> str:
    # e.g. "cpython-311-x86_64-linux-gnu": the interpreter's own extension suffix, as a name.
    return importlib.machinery.EXTENSION_SUFFIXES[0].strip(".").removesuffix(".so")


def unit_name_of(build_id: str) -> str:
    """The dir of one build for this interpreter ABI, under a cache root."""
    return f"{build_id[:16]}-{abi_tag()}"


def candidate_roots(*, temp: bool = True) -> Iterator[tuple[str, str]]:
    """Where the cache may live, in order, each with how it was chosen (for messages). ``temp``:
    the private temp dir last (its path needs ``tempfile``)."""
    explicit = os.environ.get("KL_CACHE_DIR")
    if explicit:
        yield explicit, "$KL_CACHE_DIR"
        return
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        yield os.path.join(xdg, "kilolock", "pyz"), "$XDG_CACHE_HOME"
    else:
        home = os.environ.get("HOME") or os.path.expanduser("~")
        if home and home != "~":
            yield os.path.join(home, ".cache", "kilolock", "pyz"), "home cache"
    if temp:
        import tempfile  # off the warm path: only reached when the home cache is not intact

        yield os.path.join(tempfile.gettempdir(), f"kilolock-{os.getuid()}", "pyz"), "temp dir"
