"""The extraction cache of kl.pyz: concurrent first runs, read-only HOME, damaged caches, and natives
that cannot load (codec falls back; a required one is one clear line)."""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest

from kit.paths import PLUGIN_CACHE
from kit.pyz import clean_env, extracted_files, unit_dir, version_fields


def _first_run(run_pyz, home: Path) -> Path:
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    return unit_dir(home / ".cache" / "kilolock" / "pyz")


def _recorded_sha256(pyz: Path, path: str) -> str:
    with zipfile.ZipFile(pyz) as zf:
        manifest = json.loads(zf.read("kl-pyz.json"))
    return next(n["sha256"] for n in manifest["natives"] if n["path"] == path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _same_size_garbage(path: Path) -> None:
    """Damage a file so that the cheap stat check cannot see it (same size, same mtime)."""
    st = path.stat()
    path.write_bytes(b"\x7fELF garbage" + b"\0" * (st.st_size - 12))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_four_cold_starts_at_once_extract_once(pyz, host_python, home):
    procs = [subprocess.Popen([str(host_python), "-I", str(pyz), "version"], env=clean_env(home), cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in results] == [0, 0, 0, 0], [err for _, _, err in results]
    dirs = {version_fields(out)["cache dir"] for _, out, _ in results}
    root = home / ".cache" / "kilolock" / "pyz"
    unit = unit_dir(root)
    assert dirs == {str(unit)}
    assert {version_fields(out)["codec"] for _, out, _ in results} == {"rust"}
    leftovers = [p.name for p in root.iterdir() if p.name.startswith((".tmp-", ".trash-"))]
    assert leftovers == []
    for path, (size, _) in extracted_files(unit).items():
        assert (unit / path).stat().st_size == size


@pytest.fixture
def read_only_home():
    """A HOME the running user cannot write, and a TMPDIR it can; as root, kl runs as 'nobody'
    (root ignores permission bits), so everything lives in a world-traversable directory."""
    base = Path(tempfile.mkdtemp(prefix="kl-pyz-rohome-"))
    os.chmod(base, 0o755)
    home, tmp = base / "home", base / "tmp"
    home.mkdir()
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    os.chmod(home, 0o555)
    user = "nobody" if os.geteuid() == 0 else None
    uid = pwd.getpwnam("nobody").pw_uid if user else os.getuid()
    yield home, tmp, user, uid
    for dirpath, _, _ in os.walk(base):  # some tests make dirs read-only; give rmtree its way back
        os.chmod(dirpath, 0o755)
    shutil.rmtree(base, ignore_errors=True)


def test_read_only_home_falls_back_to_a_private_temp_dir(run_pyz, pyz, read_only_home):
    home, tmp, user, uid = read_only_home
    extra = {"user": user} if user else {}
    env = {"HOME": str(home), "TMPDIR": str(tmp)}
    r = run_pyz("version", env=env, cwd=home, **extra)
    assert r.returncode == 0, r.stderr
    private = tmp / f"kilolock-{uid}"
    cache_dir = Path(version_fields(r.stdout)["cache dir"])
    assert cache_dir.parent == private / "pyz" and cache_dir.is_dir()
    assert version_fields(r.stdout)["codec"] == "rust"
    assert private.stat().st_mode & 0o777 == 0o700 and private.stat().st_uid == uid
    assert list(home.iterdir()) == []
    again = run_pyz("version", env=env, cwd=home, **extra)  # warm, from the same temp dir
    assert again.returncode == 0 and version_fields(again.stdout)["cache dir"] == str(cache_dir)


def test_temp_dir_owned_by_someone_else_is_not_used(run_pyz, read_only_home):
    # Planted before kl runs: writable by everyone (and, when the test runs as root, owned by
    # root, not by the 'nobody' that kl runs as). Loading code from it would let anyone inject.
    home, tmp, user, uid = read_only_home
    planted = tmp / f"kilolock-{uid}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    extra = {"user": user} if user else {}
    r = run_pyz("version", env={"HOME": str(home), "TMPDIR": str(tmp)}, cwd=home, **extra)
    assert r.returncode == 0, r.stderr
    codec = version_fields(r.stdout)["codec"]
    assert codec.startswith("python (the Rust codec cannot load") and "is not a private directory of this user" in codec
    assert version_fields(r.stdout)["cache dir"].endswith("(unavailable)")
    # A required native: one line with the reason, before psycopg could wander off to a system libpq.
    r = run_pyz("db", "status", env={"HOME": str(home), "TMPDIR": str(tmp)}, cwd=home, **extra)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("kl: cannot load psycopg-binary 3.3.9 (psycopg) from kl.pyz: cannot extract the native files")
    assert "is not a private directory of this user" in lines[0]
    assert list(planted.iterdir()) == []


def test_kl_cache_dir_is_used_when_set(run_pyz, tmp_path):
    r = run_pyz("version", env={"KL_CACHE_DIR": str(tmp_path / "kc")})
    assert r.returncode == 0, r.stderr
    assert Path(version_fields(r.stdout)["cache dir"]).parent == tmp_path / "kc"


def test_kl_codec_python_is_honoured(run_pyz):
    r = run_pyz("version", env={"KL_CODEC": "python"})
    assert r.returncode == 0, r.stderr
    assert version_fields(r.stdout)["codec"] == "python"


@pytest.mark.parametrize("damage", ["deleted", "truncated", "rewritten", "stamp"])
def test_a_damaged_cache_dir_is_detected_and_re_extracted(run_pyz, home, pyz, damage):
    unit = _first_run(run_pyz, home)
    target = unit / "psycopg_binary.libs" / next(p.name for p in (unit / "psycopg_binary.libs").iterdir() if p.name.startswith("libpq"))
    rel = target.relative_to(unit).as_posix()
    if damage == "deleted":
        target.unlink()
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:1000])
    elif damage == "rewritten":  # same size, new mtime: what a partial overwrite looks like
        target.write_bytes(b"\0" * target.stat().st_size)
    else:
        (unit / ".kl-extracted.json").write_text("{not json")
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    assert version_fields(r.stdout)["cache dir"] == str(unit)
    assert _sha256(unit / rel) == _recorded_sha256(pyz, rel)
    assert [p.name for p in unit.parent.iterdir() if p.name.startswith((".tmp-", ".trash-"))] == []


def test_a_damaged_compiled_code_cache_is_recompiled(run_pyz, home):
    unit = _first_run(run_pyz, home)
    cached = unit / "__pycache__" / "kilolock.cli.pyc"
    assert cached.is_file()
    cached.write_bytes(b"garbage")
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    assert cached.read_bytes() != b"garbage"


def test_the_start_up_modules_load_from_the_compiled_code_cache(run_pyz, home, pyz):
    # zipimport compiled kl.pyz's own start-up code (entry, cache, manifest, finder) from source
    # on every run, twice: a warm start takes it from the extraction's code cache like the rest.
    # A cached entry that says where it came from shows that the run used it.
    import marshal
    from importlib.util import MAGIC_NUMBER

    unit = _first_run(run_pyz, home)
    assert run_pyz("version").returncode == 0
    cached = unit / "__pycache__" / "kilolock._pyz.entry.pyc"
    assert cached.is_file()
    with zipfile.ZipFile(pyz) as zf:
        source = zf.read("kilolock/_pyz/entry.py").decode()
    marked = source + "\nimport sys\nsys.stderr.write('entry came from the code cache\\n')\n"
    cached.write_bytes(MAGIC_NUMBER + marshal.dumps(compile(marked, "entry.py", "exec", dont_inherit=True)))
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    assert "entry came from the code cache" in r.stderr


def test_codec_that_cannot_load_falls_back_to_python_and_version_says_so(run_pyz, home):
    unit = _first_run(run_pyz, home)
    _same_size_garbage(unit / "kilolock" / "_native.abi3.so")
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    codec = version_fields(r.stdout)["codec"]
    assert codec.startswith("python (the Rust codec cannot load: cannot load kilolock 0.1.0 (kilolock._native) from kl.pyz")
    forced = run_pyz("version", env={"KL_CODEC": "rust"})
    assert "KL_CODEC=rust but the Rust codec cannot be loaded" in forced.stdout


def test_required_native_that_cannot_load_is_one_line(run_pyz, home, db_url, make_state):
    unit = _first_run(run_pyz, home)
    _same_size_garbage(unit / "grpc" / "_cython" / "cygrpc.cpython-311-x86_64-linux-gnu.so")
    assert run_pyz("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}}).decode()).returncode == 0
    # grpcio is the transport where kl's native client is not built, or when asked for.
    r = run_pyz("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), env={"KL_PROVIDER_TRANSPORT": "grpcio"})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kl: cannot load grpcio 1.85.3 (grpc._cython.cygrpc) from kl.pyz: ")
    assert "this kl.pyz was built for CPython 3.10, 3.11, 3.12, 3.13 on manylinux2014_x86_64" in lines[0]
    assert "this is CPython 3.11" in lines[0]
    # Through the native client (the default) a refresh never loads grpc.
    r = run_pyz("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE))
    assert r.returncode == 0, r.stderr


def test_leftovers_of_a_killed_extraction_are_cleaned_up(run_pyz, tmp_path):
    root = tmp_path / "kc"
    r = run_pyz("version", env={"KL_CACHE_DIR": str(root)})
    unit = Path(version_fields(r.stdout)["cache dir"])
    stale = root / f".tmp-{unit.name}-killed"
    (stale / "grpc").mkdir(parents=True)
    (stale / "grpc" / "half-written.so").write_bytes(b"\0" * 100)
    shutil.rmtree(unit)  # the killed run never got to rename its temp dir into place
    r = run_pyz("version", env={"KL_CACHE_DIR": str(root)})
    assert r.returncode == 0 and version_fields(r.stdout)["cache dir"] == str(unit)
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == [unit.name]


def test_a_shared_read_only_cache_filled_by_another_user_is_used_as_is(run_pyz, read_only_home):
    # An operator host: an admin ran kl.pyz once with KL_CACHE_DIR; users only read that dir.
    home, tmp, user, _ = read_only_home
    shared = tmp / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    filled = run_pyz("version", env={"KL_CACHE_DIR": str(shared)})
    assert filled.returncode == 0, filled.stderr
    unit = version_fields(filled.stdout)["cache dir"]
    if user is None:
        os.chmod(shared, 0o555)
    for dirpath, _, _ in os.walk(shared):
        os.chmod(dirpath, 0o755 if user else 0o555)
    before = sorted(str(p) for p in shared.rglob("*"))
    extra = {"user": user} if user else {}
    r = run_pyz("version", env={"KL_CACHE_DIR": str(shared), "HOME": str(home), "TMPDIR": str(tmp)}, cwd=home, **extra)
    assert r.returncode == 0, r.stderr
    assert version_fields(r.stdout)["cache dir"] == unit and version_fields(r.stdout)["codec"] == "rust"
    assert sorted(str(p) for p in shared.rglob("*")) == before


def test_a_damaged_pyz_is_reported_not_extracted(run_pyz, pyz, tmp_path):
    broken = tmp_path / "kl.pyz"
    shutil.copyfile(pyz, broken)
    with zipfile.ZipFile(broken) as zf:
        info = zf.getinfo("native/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so")
    with open(broken, "r+b") as fh:  # flip a byte in the middle of that member's compressed data
        fh.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
        pos = info.header_offset + 30 + name_len + extra_len + info.compress_size // 2
        fh.seek(pos)
        byte = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([byte[0] ^ 0xFF]))
    r = run_pyz("version", pyz_file=broken, env={"KL_CACHE_DIR": str(tmp_path / "kc")})
    assert r.returncode == 0, r.stderr
    codec = version_fields(r.stdout)["codec"]
    assert codec.startswith("python (the Rust codec cannot load") and "kl.pyz is damaged" in codec, codec
    assert [p.name for p in (tmp_path / "kc").iterdir() if not p.name.endswith(".lock")] == []


def _generated_code(unit: Path) -> dict[str, object]:
    import marshal
    from importlib.util import MAGIC_NUMBER

    data = (unit / "__pycache__" / "generated-code.marshal").read_bytes()
    assert data[:4] == MAGIC_NUMBER  # the host python and the test's are both 3.11
    return marshal.loads(data[4:])


def test_the_methods_dataclasses_generate_are_compiled_once(run_pyz, home):
    unit = _first_run(run_pyz, home)  # `kl version` loads kilolock.schema: frozen dataclasses
    codes = _generated_code(unit)
    assert any("def __init__" in src and "nested_type" in src for src in codes), sorted(codes)[:3]
    cached = unit / "__pycache__" / "generated-code.marshal"
    before = cached.stat().st_mtime_ns
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    assert cached.stat().st_mtime_ns == before  # everything came from the cache: nothing to write


@pytest.mark.parametrize("damage", [b"garbage", b"", None])
def test_a_damaged_generated_code_cache_is_rebuilt(run_pyz, home, damage):
    unit = _first_run(run_pyz, home)
    cached = unit / "__pycache__" / "generated-code.marshal"
    if damage is None:  # right magic, truncated body
        cached.write_bytes(cached.read_bytes()[:40])
    else:
        cached.write_bytes(damage)
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    assert _generated_code(unit)
