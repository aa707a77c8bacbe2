"""Provider binaries whose AutoMTLS attempt failed, remembered across runs.

Every current Go provider fails AutoMTLS with grpcio (docs/refresh.md "Provider transport and logs"; kl's native
client completes it), and finding out costs a whole extra launch (~0.1 s) per provider per run. A
failure depends only on the binary and on the client, so it is recorded with the binary's real
path, size and mtime and the client's id ("grpcio 1.76.0", "kl-h2 0.1.0"); a new build of either
gets a fresh attempt.

The file is a cache (kilolock.provider.cachefile: anything wrong with it reads as empty, a write
that fails is skipped), consulted before grpc is imported, so the plugin can start while the client
loads.
"""
from __future__ import annotations

import os
from typing import Any

from kilolock.provider import cachefile

FILE_NAME = "plugin-tls.json"
_FORMAT = 2  # 1 recorded a bare grpcio version
_MAX_ENTRIES = 256  # binaries come and go with provider upgrades; keep the newest


def memo_path() -> str:
    """``$XDG_CACHE_HOME/kilolock/plugin-tls.json``, else ``~/.cache/kilolock/plugin-tls.json``."""
    return cachefile.path(FILE_NAME)


def _binary_key(binary: str) -> tuple[str, dict[str, int]] | None:
    try:
        real = os.path.realpath(binary)
        st = os.stat(real)
    except OSError:
        return None
    return real, {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _load() -> dict[str, Any]:
    return cachefile.read(FILE_NAME, _FORMAT, "failed")


def _store(failed: dict[str, Any]) -> None:
    if len(failed) > _MAX_ENTRIES:
        newest = sorted(failed.items(), key=lambda kv: kv[1].get("recorded_ns", 0) if isinstance(kv[1].get("recorded_ns"), int) else 0)
        failed = dict(newest[-_MAX_ENTRIES:])
    cachefile.write(FILE_NAME, _FORMAT, "failed", failed)  # a read-only home: every run tries AutoMTLS, as before


def failed_with(binary: str) -> str | None:
    """The id of the client with which AutoMTLS failed for this very binary (same path, size and
    mtime), or None when no failure is remembered."""
    key = _binary_key(binary)
    if key is None:
        return None
    entry = _load().get(key[0])
    if entry is None or any(entry.get(k) != v for k, v in key[1].items()):
        return None
    client = entry.get("client")
    return client if isinstance(client, str) else None


def remember_failure(binary: str, client: str) -> None:
    key = _binary_key(binary)
    if key is None:
        return
    import time

    failed = _load()
    failed[key[0]] = {**key[1], "client": client, "recorded_ns": time.time_ns()}
    _store(failed)


def forget(binary: str) -> None:
    """AutoMTLS worked after all (a newer client): drop the entry."""
    key = _binary_key(binary)
    if key is None:
        return
    failed = _load()
    if failed.pop(key[0], None) is not None:
        _store(failed)
