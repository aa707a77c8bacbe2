"""``kl version``."""
from __future__ import annotations

import argparse
import os
import platform
import sys

import kilolock


def _codec_backend() -> str:
    try:
        from kilolock import codec
    except ImportError as exc:  # the codec package is optional until it lands everywhere
        return f"unavailable ({exc})"
    except Exception as exc:  # a forced backend that cannot load says why
        return f"error ({exc})"
    return str(getattr(codec, "backend", "unknown"))


def cmd_version(args: argparse.Namespace) -> int:
    lines = [
        ("kilolock", kilolock.__version__),
        ("codec", _codec_backend()),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("build", os.environ.get("KL_BUILD_ID", "source")),
        ("cache dir", os.environ.get("KL_CACHE_RESOLVED", "-")),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.ljust(width)}  {value}")
    return 0
