"""Fixtures for the end-to-end refresh tests: a Terraform-applied workspace per test, and no
provider process may outlive a test."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kit.paths import LOCAL_V, PLUGIN_CACHE, TERRAFORM
from kit.procs import assert_no_new_providers, provider_pids
from kit.tfworkspace import MAIN_TF, terraform


@pytest.fixture(scope="session")
def applied_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for path, script in ((TERRAFORM, "scripts/test-terraform.sh"), (PLUGIN_CACHE / "registry.terraform.io/hashicorp/simple", "scripts/test-providers.sh"),
                         (PLUGIN_CACHE / "registry.terraform.io/hashicorp/local" / LOCAL_V, "scripts/test-providers.sh")):
        if not path.exists():
            pytest.fail(f"{path} is missing: run {script}", pytrace=False)
    ws = tmp_path_factory.mktemp("tf-applied")
    (ws / "main.tf").write_text(MAIN_TF)
    terraform(ws, "init")
    terraform(ws, "apply", "-auto-approve")
    return ws


@pytest.fixture
def workspace(applied_workspace: Path, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(applied_workspace, ws, symlinks=True)
    return ws


@pytest.fixture(params=["threads", "async", "async-grpcio"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on each of the orchestrator's read paths (KL_READ_PATH): its small states would
    otherwise only ever take the threads'. The provider's calls go through the native HTTP/2
    client ("threads", "async") or grpcio, the event loop's through grpc.aio ("async-grpcio",
    KL_PROVIDER_TRANSPORT=grpcio)."""
    path, _, transport = str(request.param).partition("-")
    monkeypatch.setenv("KL_READ_PATH", path)
    monkeypatch.setenv("KL_PROVIDER_TRANSPORT", transport or "native")
    return str(request.param)



@pytest.fixture(autouse=True)
def no_orphan_providers():
    before = provider_pids()
    yield
    assert_no_new_providers(before)
