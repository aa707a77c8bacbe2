"""``kl version``."""
from __future__ import annotations

import argparse
import os
import platform
import sys

import kilolock
from kilolock.cli.commands import CommandContext


def _codec_backend() -> str:
    try:
        from kilolock import codec
    except ImportError as exc:  # the codec package is optional until it lands everywhere
        return f"unavailable ({exc})"
    except Exception as exc:  # noqa: BLE001 - a forced backend that cannot load says why
        return f"error ({exc})"
    return str(getattr(codec, "backend", "unknown"))


def _codec_line() -> str:
    backend = _codec_backend()
    if backend == "python" and os.environ.get("KL_CODEC", "") != "python":
        try:  # say why the Rust codec is not in use when nobody asked for the Python one
            from kilolock._native import codec  # noqa: F401
        except ImportError as exc:
            return f"python (the Rust codec cannot load: {exc})"
    return backend


def _build_and_cache() -> tuple[str, str]:
    pyz = sys.modules.get("kilolock._pyz.entry")  # loaded only when running from kl.pyz
    if pyz is not None:
        return pyz.build_id(), pyz.cache_dir_description()
    return os.environ.get("KL_BUILD_ID", "source"), "-"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kl version`` takes no arguments."""


def run(args: argparse.Namespace, context: CommandContext) -> int:
    codec = _codec_line()  # first: it may extract the native files, which fixes the cache dir
    build, cache_dir = _build_and_cache()
    lines = [
        ("kilolock", kilolock.__version__),
        ("codec", codec),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("build", build),
        ("cache dir", cache_dir),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.ljust(width)}  {value}")
    return 0
