"""The cache dir of extracted native files: where it is, whether it is intact, and filling it.

One directory per (build, interpreter ABI): ``<root>/<build id>-<abi>/``, with the wheels' relative
layout kept (psycopg's extension finds its libpq through ``$ORIGIN/../psycopg_binary.libs``).
A stamp file records each extracted file's size and mtime; a start checks those with ``stat``
only (cheap), so a deleted, truncated or rewritten file sends the run to re-extraction.
Extraction happens under an exclusive lock into a temp dir that is renamed into place, so a
reader sees either nothing or a complete directory, and two first runs at once extract once.
"""
from __future__ import annotations

import json
import os
import stat
from typing import TYPE_CHECKING

from kilolock._pyz.layout import abi_tag, candidate_roots, unit_name_of
from kilolock._pyz.manifest import NATIVE_PREFIX, Manifest, NativeFile

if TYPE_CHECKING:
    import zipfile

STAMP = ".kl-extracted.json"
__all__ = ["CacheUnavailable", "abi_tag", "candidate_roots", "ensure_extracted", "is_intact", "planned_root", "unit_name"]


class CacheUnavailable(Exception):
    """No cache dir could hold the native files; the message lists every place tried and why."""


def unit_name(manifest: Manifest) -> str:
    return unit_name_of(manifest.build_id)


def is_intact(unit_dir: str, wanted: list[NativeFile]) -> bool:
    try:
        with open(os.path.join(unit_dir, STAMP), encoding="utf-8") as fh:
            recorded = json.load(fh)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if sorted(recorded) != sorted(n.path for n in wanted):
        return False
    for n in wanted:
        try:
            st = os.stat(os.path.join(unit_dir, n.path))
        except OSError:
            return False
        if st.st_size != n.size or [st.st_size, st.st_mtime_ns] != recorded[n.path]:
            return False
    return True


def _check_private(path: str) -> None:
    """The shared temp dir must be ours alone, or another user could plant code we would load."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} is not a private directory of this user")


def _prepare_root(root: str, how: str) -> None:
    if how == "temp dir":
        base = os.path.dirname(root)
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
        _check_private(base)
    os.makedirs(root, exist_ok=True)


def _extract_into(archive: zipfile.ZipFile, target: str, wanted: list[NativeFile]) -> None:
    import shutil
    import zipfile

    recorded: dict[str, list[int]] = {}
    for n in wanted:
        dest = os.path.join(target, n.path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            # zipfile checks each member's CRC-32 as it reaches the end: a damaged kl.pyz fails here.
            with archive.open(NATIVE_PREFIX + n.path) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise OSError(f"kl.pyz is damaged ({NATIVE_PREFIX + n.path}: {exc}); download it again") from None
        os.chmod(dest, 0o755)
        st = os.stat(dest)
        if st.st_size != n.size:
            raise OSError(f"{dest}: wrote {st.st_size} bytes, expected {n.size}")
        recorded[n.path] = [st.st_size, st.st_mtime_ns]
    with open(os.path.join(target, STAMP), "w", encoding="utf-8") as fh:
        json.dump({"files": recorded}, fh, sort_keys=True)


def _remove_leftovers(root: str, unit: str) -> None:
    """Temp dirs of an extraction that was killed midway. Safe: we hold the unit's lock, so no
    other process is extracting into one of them now."""
    import shutil

    for name in os.listdir(root):
        if name.startswith((f".tmp-{unit}-", f".trash-{unit}-")):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _extract_locked(archive_path: str, root: str, unit: str, wanted: list[NativeFile]) -> str:
    # Only a cold start extracts: these imports stay off the warm path.
    import fcntl
    import shutil
    import tempfile
    import zipfile

    final = os.path.join(root, unit)
    with open(os.path.join(root, f".{unit}.lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_intact(final, wanted):  # another process finished while we waited
            return final
        _remove_leftovers(root, unit)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{unit}-", dir=root)
        try:
            with zipfile.ZipFile(archive_path) as archive:
                _extract_into(archive, tmp, wanted)
            if os.path.lexists(final):
                # Damaged: move it aside first (rename cannot replace a non-empty dir); processes
                # that already mapped its libraries keep them.
                trash = tempfile.mkdtemp(prefix=f".trash-{unit}-", dir=root)
                os.rename(final, os.path.join(trash, "old"))
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def ensure_extracted(archive_path: str, manifest: Manifest, wanted: list[NativeFile]) -> str:
    """The directory holding ``wanted``, extracting them first if no intact copy exists."""
    unit = unit_name(manifest)
    for root, _ in candidate_roots():  # an intact copy anywhere will do, even on a read-only filesystem
        if is_intact(os.path.join(root, unit), wanted):
            return os.path.join(root, unit)
    problems = []
    for root, how in candidate_roots():
        try:
            _prepare_root(root, how)
            return _extract_locked(archive_path, root, unit, wanted)
        except OSError as exc:
            problems.append(f"{root} ({how}): {exc.strerror or exc}")
    raise CacheUnavailable("cannot extract the native files of kl.pyz; tried " + "; ".join(problems))


def planned_root() -> str:
    """Where extraction would go, without touching the disk (for ``kl version`` before any)."""
    return next(candidate_roots())[0]
