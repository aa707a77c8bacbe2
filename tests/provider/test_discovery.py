from __future__ import annotations

import os
from pathlib import Path

import pytest

from kilolock.errors import KlError
from kilolock.provider import launch_provider
from kilolock.provider.discovery import FoundProvider, find_provider, parse_address, search_dirs, version_key
from kit.paths import PLUGIN_CACHE
from kit.providers import BY_TYPE, require

ARCH = "linux_amd64"


def put(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def unpacked(base: Path, version: str, name: str | None = None, type_: str = "null") -> Path:
    name = name or f"terraform-provider-{type_}_v{version}_x5"
    return put(base / "registry.terraform.io" / "hashicorp" / type_ / version / ARCH / name)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home)}


def find(source: str, env: dict[str, str], cwd: Path, pinned: str | None = None, paths: tuple[str, ...] = ()) -> FoundProvider:
    return find_provider(source, pinned, list(paths), env=env, cwd=str(cwd), os_arch=ARCH)


def test_highest_version_in_the_plugin_cache_layout(tmp_path: Path, env: dict[str, str]) -> None:
    cache = Path(env["HOME"]) / ".terraform.d" / "plugin-cache"
    for v in ("2.1.2", "3.0.0-beta1", "10.0.0", "3.0.0", "not-a-version"):
        unpacked(cache, v)
    found = find("registry.terraform.io/hashicorp/null", env, tmp_path)
    assert (found.version, Path(found.binary).name) == ("10.0.0", "terraform-provider-null_v10.0.0_x5")
    assert find("hashicorp/null", env, tmp_path, pinned="v3.0.0-beta1").version == "3.0.0-beta1"
    assert find('provider["registry.terraform.io/hashicorp/null"].alias', env, tmp_path).version == "10.0.0"


def test_terraform_executable_rule(tmp_path: Path, env: dict[str, str]) -> None:
    cache = Path(env["HOME"]) / ".terraform.d" / "plugin-cache"
    d = cache / "registry.terraform.io" / "hashicorp" / "null" / "1.0.0" / ARCH
    (d / "terraform-provider-null_dir").mkdir(parents=True)  # directories are skipped
    put(d / "terraform-provider-nullify")  # wrong type: the prefix must end at _ . or the end
    put(d / "terraform-provider-null.sig.exe")
    put(d / "terraform-provider-null_anything")
    assert Path(find("hashicorp/null", env, tmp_path).binary).name == "terraform-provider-null.sig.exe"


def test_precedence_cli_then_env_then_defaults(tmp_path: Path, env: dict[str, str]) -> None:
    cli, kl_path, tf_cache = tmp_path / "cli", tmp_path / "klpath", tmp_path / "tfcache"
    workdir = tmp_path / "work"
    unpacked(workdir / ".terraform" / "providers", "9.0.0")
    unpacked(tf_cache, "8.0.0")
    env["TF_PLUGIN_CACHE_DIR"] = str(tf_cache)
    assert find("hashicorp/null", env, workdir).version == "9.0.0"  # defaults, in order
    put(kl_path / "terraform-provider-null_v1.0.0_x4")  # flat layout
    env["KL_PROVIDER_PATH"] = os.pathsep.join([str(tmp_path / "nothing"), str(kl_path)])
    found = find("hashicorp/null", env, workdir)
    assert (found.version, found.search_dir) == ("1.0.0", str(kl_path))  # env beats defaults, even with a lower version
    unpacked(cli, "0.5.0")
    assert find("hashicorp/null", env, workdir, paths=(str(cli),)).version == "0.5.0"
    # A pinned version missing from the explicit paths falls through to the defaults.
    assert find("hashicorp/null", env, workdir, pinned="8.0.0", paths=(str(cli),)).search_dir == str(tf_cache)
    dirs = search_dirs([str(cli)], env, str(workdir))
    assert dirs[:3] == [cli, tmp_path / "nothing", kl_path]
    assert dirs[3:] == [Path(env["HOME"]) / ".terraform.d" / "plugin-cache", workdir / ".terraform" / "providers", tf_cache]


def test_not_found_lists_every_place(tmp_path: Path, env: dict[str, str]) -> None:
    unpacked(tmp_path / "cli", "1.0.0")
    with pytest.raises(KlError) as err:
        find("hashicorp/null", env, tmp_path, pinned="2.0.0", paths=(str(tmp_path / "cli"),))
    msg = str(err.value)
    assert "no binary for provider registry.terraform.io/hashicorp/null version 2.0.0 for linux_amd64" in msg
    assert "(other versions found: 1.0.0)" in msg
    for place in (tmp_path / "cli", Path(env["HOME"]) / ".terraform.d" / "plugin-cache", tmp_path / ".terraform" / "providers"):
        assert str(place) in msg
    assert "(missing)" in msg and "\n" not in msg


def test_bad_source_address() -> None:
    with pytest.raises(KlError, match="is not an address like registry.terraform.io/hashicorp/null"):
        parse_address("null")


def test_version_order() -> None:
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.10.0"]
    assert sorted(ordered[::-1], key=version_key) == ordered  # noqa: C415 - reversed input: the sort must do the work
    assert version_key(None) < version_key("0.0.1")


def test_discovers_and_launches_the_real_test_cache(env: dict[str, str], tmp_path: Path) -> None:
    require(BY_TYPE["null"])
    found = find("registry.terraform.io/hashicorp/null", env, tmp_path, paths=(str(PLUGIN_CACHE),))
    assert found.version == "2.1.2" and found.binary == str(BY_TYPE["null"].path)
    with launch_provider(found.binary) as client:
        assert "null_resource" in client.get_schema().resource_schemas
