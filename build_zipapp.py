#!/usr/bin/env python3
"""Build dist/kl.pyz: kilolock and every runtime dependency in one file that runs with a bare python3.

    python build_zipapp.py                       # CPython 3.10-3.13, manylinux2014_x86_64
    python build_zipapp.py --python 3.11         # leaner: one interpreter version
    python build_zipapp.py --platform manylinux_2_28_aarch64 --codec-wheel kilolock-...aarch64.whl
    python build_zipapp.py --offline             # only the wheel cache, no pip download

Dependencies come as wheels for each target (``pip download --only-binary=:all:`` into the wheel
cache), pinned in scripts/pyz-requirements.txt; our Rust codec comes from ``maturin build
--release`` (abi3, one file for every version). Pure-Python files go at the root of the zip and
are imported in place; native files (extension modules and the shared libraries next to them) go
under native/ and are extracted at run time (kilolock/_pyz). Identical files from several targets
are stored once; the extension modules carry their interpreter tag in their names, so targets
never collide. The output is reproducible: entries sorted, fixed timestamps and permissions.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent
REQUIREMENTS = REPO / "scripts" / "pyz-requirements.txt"
DEFAULT_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
DEFAULT_PLATFORM = "manylinux2014_x86_64"
MANIFEST_NAME = "kl-pyz.json"  # read back by kilolock/_pyz (layout.MANIFEST_NAME)
NATIVE_PREFIX = "native/"
# Distributions kl cannot work without: their packages are checked at import so a host that cannot
# load them gets one line naming them. protobuf (pure-Python fallback) and the codec are optional.
REQUIRED_GATES = {"grpcio": ["grpc"], "psycopg-binary": ["psycopg", "psycopg_binary"]}
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
SKIP_SUFFIXES = (".pyi", ".pyc", ".c", ".cc", ".h", ".pxd", ".pyx")
# Files of kilolock itself that kl.pyz carries: code, migrations, the web UI's templates and assets.
SOURCE_SUFFIXES = (".py", ".sql", ".html", ".css", ".svg")

MAIN = """\
import sys
if sys.version_info < (3, 10):
    sys.stderr.write("kl: this kl.pyz needs Python 3.10 or newer; this is Python %s\\n" % sys.version.split()[0])
    sys.exit(1)
import os.path
from kilolock._pyz import bytecode
bytecode.install_early(os.path.dirname(__file__), __loader__)
from kilolock._pyz.entry import main
sys.exit(main(os.path.dirname(__file__)))
"""


class BuildError(Exception):
    pass


class Wheel(NamedTuple):
    path: Path
    dist: str  # normalised: grpcio, psycopg-binary
    version: str
    tags: str  # python-abi-platform


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel(path: Path) -> Wheel:
    parts = path.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise BuildError(f"{path}: not a wheel file name")
    return Wheel(path, _normalise(parts[0]), parts[1], "-".join(parts[-3:]))


def read_requirements() -> list[tuple[str, str]]:
    pins = []
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            if not version:
                raise BuildError(f"{REQUIREMENTS}: {line!r} is not pinned with ==")
            pins.append((_normalise(name), version.strip()))
    return pins


def _platform_aliases(platform: str) -> list[str]:
    """pip matches --platform literally: a manylinux target also accepts every older manylinux."""
    m = re.fullmatch(r"manylinux(?:2014|_2_(\d+))_(\w+)", platform)
    if not m:
        return [platform]
    newest, arch = int(m.group(1) or 17), m.group(2)
    return [f"manylinux_2_{v}_{arch}" for v in range(newest, 16, -1)] + [f"manylinux2014_{arch}"]


def fetch_wheels(python: str, platform: str, cache: Path, offline: bool) -> list[Wheel]:
    """The pinned wheels for one target, downloaded into ``cache/<platform>/cp3X`` when missing."""
    pins = read_requirements()
    tag = "cp" + python.replace(".", "")
    target_dir = cache / platform / tag
    target_dir.mkdir(parents=True, exist_ok=True)

    def present() -> dict[str, Wheel]:
        found = {}
        for p in sorted(target_dir.glob("*.whl")):
            w = parse_wheel(p)
            if (w.dist, w.version) in pins:
                found[w.dist] = w
        return found

    wheels = present()
    missing = [f"{n}=={v}" for n, v in pins if n not in wheels]
    if missing:
        if offline:
            raise BuildError(f"--offline: no wheel of {', '.join(missing)} for {tag} {platform} in {target_dir}")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
               "--abi", tag, "--abi", "abi3", "--abi", "none", "--dest", str(target_dir), *missing]
        for alias in _platform_aliases(platform):
            cmd[cmd.index("--implementation"):cmd.index("--implementation")] = ["--platform", alias]
        print(f"build: pip download {' '.join(missing)} for {tag} {platform}", file=sys.stderr)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"pip download failed for {tag} {platform}:\n{r.stderr.strip()}")
        wheels = present()
        still = [f"{n}=={v}" for n, v in pins if n not in wheels]
        if still:
            raise BuildError(f"pip download gave no wheel of {', '.join(still)} for {tag} {platform}")
    return [wheels[n] for n, _ in pins]


def _codec_build_command(out: Path) -> tuple[list[str], dict[str, str]]:
    """maturin where there is one (its release build); else pip's PEP 517 build of this checkout,
    which fetches maturin into an isolated build env, as `pip install -e .` does.

    With ziglang installed next to maturin, the codec links for manylinux2014 (glibc 2.17, as the
    grpcio and psycopg-binary wheels); otherwise it needs the build host's glibc or newer, and
    older hosts fall back to the pure-Python codec."""
    import importlib.util

    env = dict(os.environ)
    if importlib.util.find_spec("maturin") is not None:
        cmd = [sys.executable, "-m", "maturin", "build", "--release", "--quiet", "--out", str(out)]
        if importlib.util.find_spec("ziglang") is not None:
            cmd += ["--zig", "--compatibility", "manylinux2014"]
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        return cmd, env
    if shutil.which("maturin"):
        return [str(shutil.which("maturin")), "build", "--release", "--quiet", "--out", str(out)], env
    return [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO)], env


# What the codec build reads besides codec_rs/src/.
CODEC_INPUTS = ("pyproject.toml", ".cargo/config.toml", "codec_rs/Cargo.toml", "codec_rs/Cargo.lock")


def codec_wheel_dir(cache: Path, repo: Path = REPO) -> Path:
    """Where the codec wheel of REPO's sources goes in the cache: a directory named by the hash of
    what its build reads. Every wheel of ours has the same file name (kilolock-0.1.0-cp310-abi3-…),
    so in one flat directory a build from other sources (another checkout or commit, the extension
    under another module name) would take the place of this one's, or be taken for it."""
    h = hashlib.sha256()
    for path in [repo / p for p in CODEC_INPUTS] + sorted((repo / "codec_rs" / "src").rglob("*.rs")):
        h.update(path.relative_to(repo).as_posix().encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"-")
        h.update(b"\0")
    return cache / "codec" / h.hexdigest()[:16]


def build_codec_wheel(cache: Path) -> Path:
    """Our Rust extension as an abi3 wheel: one file for every CPython >= 3.10."""
    out = Path(tempfile.mkdtemp(prefix="codec-", dir=cache))
    try:
        cmd, env = _codec_build_command(out)
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise BuildError(f"building the Rust codec failed ({' '.join(cmd[:4])} ...; is Rust installed?):\n"
                             f"{r.stderr.strip()[-3000:]}")
        built = sorted(out.glob("kilolock-*.whl"))
        if len(built) != 1:
            raise BuildError(f"the codec build produced {[p.name for p in built]}, expected one kilolock wheel")
        if "manylinux2014" not in built[0].name:
            print(f"build: the Rust codec ({built[0].name}) needs this host's glibc or newer; older hosts will "
                  "use the pure-Python codec (install ziglang next to maturin for a manylinux2014 codec)", file=sys.stderr)
        final = codec_wheel_dir(cache) / built[0].name
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(built[0], final)
        return final
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _is_native(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    parent = name.rsplit("/", 1)[0] if "/" in name else ""
    return base.endswith(".so") or ".so." in base or parent.endswith(".libs")


def _native_module(name: str) -> str | None:
    """grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so -> grpc._cython.cygrpc; libraries -> None."""
    parent, _, base = name.rpartition("/")
    if parent.endswith(".libs") or not base.endswith(".so") or base.startswith("lib"):
        return None
    return ".".join([*parent.split("/"), base.split(".", 1)[0]]) if parent else base.split(".", 1)[0]


def _version_module(wheel: Wheel) -> bytes:
    # The wheel's own file asks importlib.metadata, which costs every kl start about 20 ms (it
    # loads the email, zipfile and csv modules and scans sys.path) and finds nothing in the zip,
    # which keeps no dist-info ("0.0.0.0"): the answer is this wheel's version, known now.
    return (f'"""{wheel.dist} distribution version (written by kl\'s build_zipapp.py)."""\n\n'
            f'__version__ = "{wheel.version}"\n').encode()


# Files of the bundled wheels that the build replaces: path in the wheel -> new content.
REWRITES: dict[str, Callable[[Wheel], bytes]] = {
    "psycopg/version.py": _version_module,
    "psycopg_binary/version.py": _version_module,
}


class Contents:
    """The files of the zip: name -> bytes, with natives recorded for the manifest."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.natives: dict[str, dict] = {}
        self.dists: dict[str, dict] = {}

    def add(self, name: str, data: bytes, origin: str) -> None:
        old = self.files.get(name)
        if old is not None and old != data:
            if ".dist-info/" in name:
                return  # licence texts: the first copy is as good as any
            raise BuildError(f"{name} differs between wheels ({origin}); cannot store both at one path")
        self.files[name] = data

    def add_wheel(self, wheel: Wheel, only_natives: bool = False) -> None:
        info = self.dists.setdefault(wheel.dist, {"version": wheel.version, "wheels": []})
        if info["version"] != wheel.version:
            raise BuildError(f"two versions of {wheel.dist}: {info['version']} and {wheel.version}")
        if wheel.path.name not in info["wheels"]:
            info["wheels"].append(wheel.path.name)
        if wheel.dist in REQUIRED_GATES:
            info["required"], info["gates"] = True, REQUIRED_GATES[wheel.dist]
        with zipfile.ZipFile(wheel.path) as zf:
            for item in zf.infolist():
                name = item.filename
                if item.is_dir() or "__pycache__/" in name or name.endswith(SKIP_SUFFIXES):
                    continue
                if ".dist-info/" in name and not re.search(r"\.dist-info/(licenses/|LICENSE|COPYING)", name):
                    continue
                native = _is_native(name)
                if only_natives and not native:
                    continue
                data = zf.read(item)
                if name in REWRITES:
                    data = REWRITES[name](wheel)
                if native:
                    self.add(NATIVE_PREFIX + name, data, wheel.path.name)
                    self.natives[name] = {"path": name, "dist": wheel.dist, "module": _native_module(name),
                                          "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                else:
                    self.add(name, data, wheel.path.name)

    def add_source(self) -> None:
        """kilolock's pure-Python code, migrations and the web UI's templates and static files from
        this checkout (the codec comes as a wheel)."""
        root = REPO / "kilolock"
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                if fn.endswith(SOURCE_SUFFIXES) and not fn.startswith("_native"):
                    path = Path(dirpath) / fn
                    self.add(path.relative_to(REPO).as_posix(), path.read_bytes(), "source")


def _directories(names: list[str]) -> set[str]:
    # Explicit directory entries: zipimport needs them to see namespace packages (google/).
    dirs = set()
    for name in names:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]) + "/")
    return dirs


def write_zip(contents: Contents, pythons: list[str], platform: str, output: Path) -> tuple[str, str]:
    import kilolock

    files = dict(contents.files)
    files["__main__.py"] = MAIN.encode()
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    build_id = digest.hexdigest()
    dists = {d: {k: v for k, v in info.items() if k != "wheels"} for d, info in sorted(contents.dists.items())}
    manifest = {
        "format": 1, "build_id": build_id, "kilolock_version": kilolock.__version__,
        "platform": platform, "machine": _arch(platform), "pythons": pythons,
        "dists": dists, "wheels": sorted(w for info in contents.dists.values() for w in info["wheels"]),
        "natives": [contents.natives[k] for k in sorted(contents.natives)],
    }
    files[MANIFEST_NAME] = json.dumps(manifest, indent=1, sort_keys=True).encode()

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(fh, "w") as zf:
            # Natives' own directories too (without native/): a package holding only a native module
            # (google/_upb) must exist in the zip as a namespace package for its import to reach our hook.
            dirs = _directories(list(files)) | _directories(list(contents.natives))
            for name in sorted(set(files) | dirs):
                info = zipfile.ZipInfo(name, FIXED_TIME)
                info.create_system = 3  # unix, so the permission bits below are honoured
                if name.endswith("/"):
                    info.external_attr = (0o40755 << 16) | 0x10
                    zf.writestr(info, b"")
                    continue
                info.external_attr = (0o100755 if name.startswith(NATIVE_PREFIX) else 0o100644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, files[name], compresslevel=9)
    os.chmod(tmp, 0o755)
    os.replace(tmp, output)
    return build_id, hashlib.sha256(output.read_bytes()).hexdigest()


def _arch(platform: str) -> str:
    m = re.search(r"(x86_64|aarch64|i686|ppc64le|s390x|armv7l)$", platform)
    if not m:
        raise BuildError(f"--platform {platform!r}: expected a Linux wheel platform tag like manylinux2014_x86_64")
    return m.group(1)


def build(pythons: list[str], platform: str, cache: Path, output: Path, codec_wheel: Path | None,
          no_codec: bool, offline: bool) -> tuple[str, str]:
    contents = Contents()
    contents.add_source()
    abi3: dict[str, Wheel] = {}
    for python in pythons:  # oldest first
        for wheel in fetch_wheels(python, platform, cache, offline):
            if wheel.tags.split("-")[1] == "abi3":
                # The abi3 wheel of the oldest target runs on every newer one; a newer target's
                # (cryptography's cp311-abi3 beside its cp39-abi3) would put other natives at the
                # same paths.
                wheel = abi3.setdefault(wheel.dist, wheel)
            contents.add_wheel(wheel)
    if not no_codec:
        if codec_wheel is None:
            import platform as host

            if _arch(platform) != host.machine():
                raise BuildError(f"cannot build the Rust codec for {platform} here: pass --codec-wheel, or --no-codec "
                                 "(kl then uses the pure-Python codec)")
            codec_wheel = build_codec_wheel(cache)
        contents.add_wheel(parse_wheel(codec_wheel), only_natives=True)
    return write_zip(contents, pythons, platform, output)


def _pythons(values: list[str] | None) -> list[str]:
    if not values:
        return list(DEFAULT_PYTHONS)
    out: list[str] = []
    for v in values:
        for p in v.split(","):
            p = p.strip()
            if not re.fullmatch(r"3\.1\d", p):
                raise BuildError(f"--python {p!r}: give a CPython version from 3.10 up, like 3.11")
            if p not in out:
                out.append(p)
    return sorted(out, key=lambda p: int(p.split(".")[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build kl.pyz, a single-file kilolock for python3.")
    ap.add_argument("--python", action="append", metavar="X.Y", help="target CPython version(s), repeatable or "
                    f"comma-separated (default {','.join(DEFAULT_PYTHONS)})")
    ap.add_argument("--platform", default=DEFAULT_PLATFORM, help=f"wheel platform tag (default {DEFAULT_PLATFORM})")
    ap.add_argument("-o", "--output", type=Path, default=REPO / "dist" / "kl.pyz")
    ap.add_argument("--wheel-cache", type=Path, default=Path(os.environ.get("KL_PYZ_WHEEL_CACHE", REPO / ".cache" / "pyz-wheels")),
                    help="where downloaded wheels are kept (default .cache/pyz-wheels, or $KL_PYZ_WHEEL_CACHE)")
    ap.add_argument("--codec-wheel", type=Path, help="a prebuilt kilolock wheel to take the Rust codec from")
    ap.add_argument("--no-codec", action="store_true", help="leave the Rust codec out (pure-Python codec)")
    ap.add_argument("--offline", action="store_true", help="use only wheels already in the cache")
    args = ap.parse_args(argv)
    try:
        pythons = _pythons(args.python)
        _arch(args.platform)
        args.wheel_cache.mkdir(parents=True, exist_ok=True)
        build_id, sha = build(pythons, args.platform, args.wheel_cache.resolve(), args.output, args.codec_wheel,
                              args.no_codec, args.offline)
    except BuildError as exc:
        print(f"build_zipapp: {exc}", file=sys.stderr)
        return 1
    size = args.output.stat().st_size
    print(f"{args.output}: {size} bytes ({size / 2**20:.1f} MiB), sha256 {sha}, build {build_id[:16]}, "
          f"CPython {','.join(pythons)} {args.platform}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
