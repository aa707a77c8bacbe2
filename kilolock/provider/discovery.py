"""Finding a provider binary on disk, the way Terraform lays provider caches out.

Search directories, in precedence order: ``--provider-search-path`` (repeatable) > ``KL_PROVIDER_PATH``
(os.pathsep-separated) > the defaults ``~/.terraform.d/plugin-cache``, ``./.terraform/providers``,
``$TF_PLUGIN_CACHE_DIR``. The defaults always apply, after the explicit ones. The first directory
that holds the provider (at the pinned version, if one is pinned) wins, and in it the highest
version: an operator who names a directory means that directory.

Layouts understood in each directory D:
- unpacked (plugin cache, ``.terraform/providers``, filesystem mirrors):
  ``D/HOST/NAMESPACE/TYPE/VERSION/OS_ARCH/`` holding the executable, picked as Terraform does: the
  first entry in lexical order named ``terraform-provider-TYPE`` followed by nothing, ``_`` or ``.``;
- flat: ``D/terraform-provider-TYPE_vVERSION[_xN]`` (also under ``D/OS_ARCH/``, the old
  ``terraform.d/plugins`` shape); a binary without a version in its name sorts below any version.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilolock.provider.errors import NO_BINARY, ProviderNotFoundError

DEFAULT_HOST = "registry.terraform.io"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "i386": "386", "i686": "386", "armv7l": "arm"}
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_ADDRESS_WRAPPER = re.compile(r'^provider\["(.+)"\](?:\..+)?$')


@dataclass(frozen=True)
class ProviderAddress:
    """A provider's source address: host/namespace/type."""

    host: str
    namespace: str
    type: str

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}/{self.type}"


@dataclass(frozen=True)
class FoundProvider:
    """The provider binary discovery chose, and where it was found."""

    address: ProviderAddress
    version: str | None  # None for a flat binary whose name carries no version
    binary: str
    search_dir: str

    def describe(self) -> str:
        return f"{self.address} {self.version or '(unversioned)'} at {self.binary}"


def parse_address(source: str) -> ProviderAddress:
    """``registry.terraform.io/hashicorp/null``, ``hashicorp/null`` or ``provider["..."]``."""
    text = source.strip()
    m = _ADDRESS_WRAPPER.match(text)
    if m:
        text = m.group(1)
    parts = text.split("/")
    if len(parts) == 2:
        parts = [DEFAULT_HOST, *parts]
    if len(parts) != 3 or not all(parts):
        raise ProviderNotFoundError(f"provider source {source!r} is not an address like registry.terraform.io/hashicorp/null")
    return ProviderAddress(parts[0].lower(), parts[1].lower(), parts[2].lower())


def current_os_arch() -> str:
    # os.uname(), not the platform module: what platform.system()/machine() answer on POSIX, without
    # importing platform (2 ms of every refresh's start).
    uname = os.uname()
    system, machine = uname.sysname.lower(), uname.machine.lower()
    return f"{system}_{_ARCH.get(machine, machine)}"


def search_dirs(cli_paths: Sequence[str] = (), env: Mapping[str, str] | None = None, cwd: str | None = None) -> list[Path]:
    env = os.environ if env is None else env
    base = Path(cwd or os.getcwd())
    dirs: list[Path] = [Path(p) for p in cli_paths]
    dirs += [Path(p) for p in env.get("KL_PROVIDER_PATH", "").split(os.pathsep) if p]
    home = env.get("HOME") or str(Path.home())
    dirs += [Path(home) / ".terraform.d" / "plugin-cache", base / ".terraform" / "providers"]
    if env.get("TF_PLUGIN_CACHE_DIR"):
        dirs.append(Path(env["TF_PLUGIN_CACHE_DIR"]))
    out: list[Path] = []
    for d in dirs:
        d = d if d.is_absolute() else base / d
        if d not in out:
            out.append(d)
    return out


def version_key(version: str | None) -> tuple[Any, ...]:
    """Semantic-version order; a pre-release sorts below its release; None below everything."""
    if version is None:
        return (-1,)
    m = _SEMVER.match(version)
    if not m:
        return (-1,)
    pre = m.group(4)
    pre_key: tuple[Any, ...] = (1,) if pre is None else (0, *((0, int(x), "") if x.isdigit() else (1, 0, x) for x in pre.split(".")))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), pre_key)


def _executable_in(directory: Path, type_name: str) -> Path | None:
    prefix = f"terraform-provider-{type_name}"
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    for name in names:
        if name.startswith(prefix) and (len(name) == len(prefix) or name[len(prefix)] in "_."):
            path = directory / name
            if not path.is_dir():
                return path
    return None


def _candidates(d: Path, addr: ProviderAddress, os_arch: str) -> list[tuple[str | None, Path]]:
    found: list[tuple[str | None, Path]] = []
    unpacked = d / addr.host / addr.namespace / addr.type
    try:
        versions = os.listdir(unpacked)
    except OSError:
        versions = []
    for version in versions:
        if version_key(version) == (-1,):
            continue
        exe = _executable_in(unpacked / version / os_arch, addr.type)
        if exe is not None:
            found.append((version, exe))
    flat = re.compile(rf"^terraform-provider-{re.escape(addr.type)}(?:_v([^_]+))?(?:_x\d+)?(?:\.exe)?$")
    for directory in (d, d / os_arch):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            m = flat.match(name)
            path = directory / name
            if m and not path.is_dir():
                found.append((m.group(1), path))
    return found


def find_provider(
    source: str,
    pinned: str | None = None,
    search_paths: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    os_arch: str | None = None,
) -> FoundProvider:
    addr = parse_address(source)
    os_arch = os_arch or current_os_arch()
    want = pinned.lstrip("v") if pinned else None
    looked: list[str] = []
    other_versions: set[str] = set()
    for d in search_dirs(search_paths, env, cwd):
        note = "" if d.is_dir() else " (missing)"
        looked.append(f"{d}/{addr}/*/{os_arch}, {d}/terraform-provider-{addr.type}_v*{note}")
        candidates = _candidates(d, addr, os_arch)
        if want is not None:
            other_versions.update(v for v, _ in candidates if v and v != want)
            candidates = [(v, p) for v, p in candidates if v == want]
        if not candidates:
            continue
        version, path = max(candidates, key=lambda c: (version_key(c[0]), str(c[1])))
        return FoundProvider(addr, version, str(path), str(d))
    what = f"{addr} version {want}" if want else str(addr)
    others = f" (other versions found: {', '.join(sorted(other_versions, key=version_key))})" if other_versions else ""
    raise ProviderNotFoundError(
        f"{NO_BINARY} {what} for {os_arch}{others}; looked in: {'; '.join(looked)}. "
        "Run terraform init, or pass --provider-search-path DIR / set KL_PROVIDER_PATH"
    )
