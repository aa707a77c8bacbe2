"""build_zipapp.py: contents, size, reproducibility, leaner targets and their clear failure on another
interpreter, and its own errors."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kit.paths import PLUGIN_CACHE, REPO
from kit.pyz import WHEEL_CACHE, build, codec_wheel_dir, find_python, version_fields

MiB = 1 << 20


def _manifest(pyz: Path) -> dict:
    with zipfile.ZipFile(pyz) as zf:
        return json.loads(zf.read("kl-pyz.json"))


def test_default_build_holds_every_target_once_and_fits_the_size_budget(pyz):
    # ~40 MiB, ~7 of them cryptography's Rust extension (kl serve's OIDC signatures), stored once.
    assert pyz.stat().st_size <= 44 * MiB, f"{pyz.stat().st_size / MiB:.1f} MiB"
    m = _manifest(pyz)
    assert m["pythons"] == ["3.10", "3.11", "3.12", "3.13"] and m["platform"] == "manylinux2014_x86_64"
    natives = {n["path"] for n in m["natives"]}
    for tag in ("310", "311", "312", "313"):
        assert f"grpc/_cython/cygrpc.cpython-{tag}-x86_64-linux-gnu.so" in natives
        assert f"psycopg_binary/pq.cpython-{tag}-x86_64-linux-gnu.so" in natives
    assert len([p for p in natives if p.startswith("psycopg_binary.libs/libpq")]) == 1  # shared across versions
    assert {"kilolock/_native.abi3.so", "google/_upb/_message.abi3.so"} <= natives
    # abi3: one copy of the oldest target's wheel serves every newer Python.
    assert "cryptography/hazmat/bindings/_rust.abi3.so" in natives
    assert [w for w in m["wheels"] if w.startswith("cryptography-")] == [
        "cryptography-50.0.2-cp39-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"]
    with zipfile.ZipFile(pyz) as zf:
        names = set(zf.namelist())
        infos = zf.infolist()
    assert "kilolock/_migrations/0001_init.sql" in names and "kilolock/provider/_pb/tfplugin6_pb2.py" in names
    assert not any(n.endswith(".so") and not n.startswith("native/") for n in names)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert [i.filename for i in infos] == sorted(i.filename for i in infos)


def test_same_inputs_give_the_same_bytes_and_the_build_prints_size_and_sha256(pyz_build_dir, codec_args, lean_pyz):
    again = pyz_build_dir / "again" / "kl-312.pyz"
    # --offline against the session's wheel cache: the very same wheels, no network.
    r = subprocess.run([sys.executable, str(REPO / "build_zipapp.py"), "-o", str(again), "--python", "3.12", "--offline",
                        "--wheel-cache", str(WHEEL_CACHE), *codec_args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    sha = hashlib.sha256(again.read_bytes()).hexdigest()
    assert again.read_bytes() == lean_pyz.read_bytes()
    assert re.search(rf"{again.stat().st_size} bytes \(\d+\.\d MiB\), sha256 {sha}", r.stdout), r.stdout


def test_a_lean_build_names_what_it_was_built_for_on_another_python(run_pyz, lean_pyz, pyz, db_url):
    assert lean_pyz.stat().st_size < pyz.stat().st_size / 2
    assert _manifest(lean_pyz)["pythons"] == ["3.12"]
    r = run_pyz("version", pyz_file=lean_pyz)  # the abi3 codec loads on 3.11 too
    assert r.returncode == 0 and version_fields(r.stdout)["codec"] == "rust", r.stdout + r.stderr
    r = run_pyz("db", "status", pyz_file=lean_pyz)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"kl: cannot load psycopg-binary 3\.3\.9 \(psycopg\) from kl\.pyz: no build of it for this interpreter; "
        r"this kl\.pyz was built for CPython 3\.12 on manylinux2014_x86_64, and this is CPython 3\.11\.\d+ on linux x86_64",
        lines[0]), r.stderr


def test_a_lean_build_runs_on_its_own_python(run_pyz, lean_pyz, db_url):
    r = run_pyz("db", "status", pyz_file=lean_pyz, python=find_python("12"))
    assert r.returncode == 0 and "current" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("minor", ["10", "12", "13"])
def test_the_default_build_refreshes_on_every_target_python(run_pyz, db_url, minor, small_workspace, tmp_path):
    python = find_python(minor)
    r = run_pyz("version", python=python)
    assert r.returncode == 0, r.stderr
    f = version_fields(r.stdout)
    assert f["codec"] == "rust" and f["python"].startswith(f"3.{minor}.")
    assert f"cpython-3{minor}-x86_64-linux-gnu" in f["cache dir"]
    # psycopg-binary, then grpc, the generated stubs and the codec of this version, against real providers.
    ws = tmp_path / "ws"
    shutil.copytree(small_workspace, ws, symlinks=True)
    r = run_pyz("state", "import", "prod", str(ws / "terraform.tfstate"), python=python)
    assert r.returncode == 0, r.stderr
    r = run_pyz("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", python=python, cwd=ws,
                py_args=("-X", "importtime"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["status"], out["resources_checked"], out["resources_failed"]) == ("succeeded", 4, 0)
    # kilolock.lazyimports, set up by the zip's entry: protobuf's pure-Python backend, which its
    # descriptor pool imports, is imported as a placeholder whose code never runs, so what that
    # code imports (text_format, the decoder) is never imported.
    imported = {line.rpartition("|")[2].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "google.protobuf.descriptor_pool" in imported
    assert not imported & {"google.protobuf.text_format", "google.protobuf.internal.decoder"}


def test_build_errors_are_one_line(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "build_zipapp.py"), "-o", str(tmp_path / "x.pyz"), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=120)

    r = run("--offline", "--wheel-cache", str(tmp_path / "empty"), "--no-codec", "--python", "3.11")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "--offline: no wheel of " in r.stderr and "grpcio==1.85.3" in r.stderr and "cp311" in r.stderr
    r = run("--python", "3.9", "--no-codec")
    assert r.returncode == 1 and "--python '3.9': give a CPython version from 3.10 up" in r.stderr
    r = run("--platform", "win_amd64", "--no-codec", "--offline", "--wheel-cache", str(tmp_path / "empty"))
    assert r.returncode == 1 and "expected a Linux wheel platform tag" in r.stderr
    assert not (tmp_path / "x.pyz").exists()


def test_another_platform_builds_and_says_what_it_is_for_on_this_one(run_pyz, pyz_build_dir, db_url):
    # aarch64 wheels, no codec (it cannot be cross-built here without --codec-wheel): the file runs
    # `version` anywhere, and a command needing grpc or libpq names the mismatch in one line.
    other = build(pyz_build_dir / "kl-aarch64.pyz", "--platform", "manylinux_2_28_aarch64", "--python", "3.11", "--no-codec")
    natives = {n["path"] for n in _manifest(other)["natives"]}
    assert "grpc/_cython/cygrpc.cpython-311-aarch64-linux-gnu.so" in natives
    assert not any("x86_64" in p for p in natives)
    r = run_pyz("version", pyz_file=other)
    assert r.returncode == 0, r.stderr
    assert version_fields(r.stdout)["codec"].startswith("python (the Rust codec cannot load")
    r = run_pyz("db", "status", pyz_file=other)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert re.fullmatch(r"kl: cannot load psycopg-binary 3\.3\.9 \(psycopg\) from kl\.pyz: no build of it for this interpreter; "
                        r"this kl\.pyz was built for CPython 3\.11 on manylinux_2_28_aarch64, and this is CPython 3\.11\.\d+ on linux x86_64",
                        lines[0]), lines[0]


def test_the_codec_wheel_is_cached_by_the_sources_it_was_built_from(tmp_path):
    # Every build of ours names its wheel alike: a checkout with other codec sources (another
    # commit, the extension under another module name) must put its wheel somewhere else.
    files = ["pyproject.toml", ".cargo/config.toml", "codec_rs/Cargo.toml", "codec_rs/Cargo.lock", "codec_rs/src/lib.rs"]
    copies = {}
    for name in ("a", "b"):
        for f in files:
            (tmp_path / name / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / f, tmp_path / name / f)
        copies[name] = tmp_path / name
    cache = tmp_path / "cache"
    assert codec_wheel_dir(cache, copies["a"]) == codec_wheel_dir(cache, copies["b"])
    assert codec_wheel_dir(cache, copies["a"]).parent == cache / "codec"
    lib = copies["b"] / "codec_rs" / "src" / "lib.rs"
    lib.write_text(lib.read_text().replace('"kilolock._native"', '"kilolock._other"'))
    assert codec_wheel_dir(cache, copies["a"]) != codec_wheel_dir(cache, copies["b"])
    pyproject = copies["a"] / "pyproject.toml"
    before = codec_wheel_dir(cache, copies["a"])
    pyproject.write_text(pyproject.read_text().replace('module-name = "kilolock._native"', 'module-name = "kilolock._other"'))
    assert codec_wheel_dir(cache, copies["a"]) != before
