"""Notifications end to end with real Terraform 1.0.3, the real local provider and real refreshes.

Terraform applies through a real `kl serve`; files change behind its back; three refreshes see it
and a webhook receiver gets exactly one drift.new (the ignored address: nothing); Terraform's next
apply through kl serve resolves it, and kl serve's own sender delivers drift.resolved. A refresh
the mass-removal guard refuses sends refresh.guarded, and refresh.failed once per failure streak,
when the streak reaches the channel's --failed-after.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.paths import LOCAL_V, PLUGIN_CACHE, TERRAFORM
from kit.procs import assert_no_new_providers, provider_pids
from kit.tfcli import http_backend
from kit.tfworkspace import terraform
from kit.webhook import Receiver

SECRET = "real-test-hmac"
FILES = '["one", "two", "three", "four"]'


def main_tf(backend: str) -> str:
    return f"""
terraform {{
  required_providers {{
    local = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
  }}
  {backend}
}}
resource "local_file" "f" {{
  for_each = toset({FILES})
  filename = "${{path.module}}/out/${{each.key}}.txt"
  content  = "hello ${{each.key}}"
}}
"""


@pytest.fixture(autouse=True)
def _tools_and_no_orphans() -> Iterator[None]:
    if not TERRAFORM.exists():
        pytest.fail(f"{TERRAFORM} is missing: run scripts/test-terraform.sh", pytrace=False)
    before = provider_pids()
    yield
    assert_no_new_providers(before)


def refresh(run_kl, ws: Path) -> dict:
    r = run_kl("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", cwd=ws)
    assert r.stdout, r.stderr
    out: dict = json.loads(r.stdout)
    return out


def test_one_new_across_three_refreshes_then_resolved_by_an_apply_through_kl_serve(run_kl, kl_serve: str, tmp_path: Path,
                                                                                     receiver: Receiver):
    assert run_kl("notify", "add", "hook", "--webhook", receiver.url, "--secret", SECRET).returncode == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    url = f"{kl_serve}/states/prod"
    (ws / "main.tf").write_text(main_tf(http_backend(url)))
    terraform(ws, "init")
    terraform(ws, "apply", "-auto-approve")
    assert run_kl("state", "set", "prod", "--workdir", str(ws)).returncode == 0
    r = run_kl("drift", "ignore", "add", "--states", "prod", "--address", 'local_file.f["three"]')
    assert r.returncode == 0, r.stderr

    (ws / "out" / "two.txt").write_text("changed behind Terraform's back")
    (ws / "out" / "three.txt").unlink()
    outs = [refresh(run_kl, ws) for _ in range(3)]
    assert [o["status"] for o in outs] == ["succeeded"] * 3, outs
    assert sorted(outs[0]["changed_addresses"]) == ['local_file.f["three"]', 'local_file.f["two"]']
    [new] = receiver.events()
    assert new.json["event"] == "drift.new" and new.signed_by(SECRET)
    assert [a["address"] for a in new.json["addresses"]] == ['local_file.f["two"]']
    # Found by the first run's observation: the serial is the Terraform version it observed.
    assert [(o["to_serial"], o["observation"]) for o in outs] == [
        (None, f"v{outs[0]['from_serial']}.{n}") for n in (1, 2, 3)], outs
    assert new.json["run_id"] == outs[0]["run_id"] and new.json["serial"] == outs[0]["from_serial"]
    assert new.json["observation"] == outs[0]["observation"]  # which of v7's observations found it

    terraform(ws, "apply", "-auto-approve")  # through kl serve: its sender thread delivers
    got = receiver.wait_for(2)
    assert [r.json["event"] for r in got] == ["drift.new", "drift.resolved"], [r.json for r in got]
    resolved = got[1].json
    assert [(a["address"], a["resolved_how"]) for a in resolved["addresses"]] == [('local_file.f["two"]', "recreated")]
    assert (resolved["source"], resolved["observation"]) == ("apply", None) and got[1].signed_by(SECRET)
    assert len({r.headers["Idempotency-Key"] for r in got}) == 2
    refresh(run_kl, ws)
    assert len(receiver.events()) == 2


def test_the_guard_sends_refresh_guarded_and_failures_in_a_row_send_refresh_failed_once(run_kl, db_url, tmp_path: Path,
                                                                                       start_receiver):
    every, second = start_receiver(), start_receiver()
    assert run_kl("notify", "add", "every", "--webhook", every.url, "--events", "refresh.failed,refresh.guarded").returncode == 0
    assert run_kl("notify", "add", "second", "--webhook", second.url, "--events", "refresh.failed",
                  "--failed-after", "2").returncode == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.tf").write_text(main_tf(""))
    terraform(ws, "init")
    terraform(ws, "apply", "-auto-approve")
    assert run_kl("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply").returncode == 0
    assert run_kl("state", "set", "prod", "--workdir", str(ws)).returncode == 0
    for name in ("one", "two", "three"):
        (ws / "out" / f"{name}.txt").unlink()

    first = refresh(run_kl, ws)
    assert first["status"] == "failed", first
    assert sorted(r.json["event"] for r in every.events()) == ["refresh.failed", "refresh.guarded"]
    guarded = next(r.json for r in every.events() if r.json["event"] == "refresh.guarded")
    assert guarded["run_id"] == first["run_id"] and "bad credentials" in guarded["refresh"]["error"]
    assert second.events() == []

    refresh(run_kl, ws)  # the streak goes on: guarded again, failed not again; the second channel's turn
    assert sorted(r.json["event"] for r in every.events()) == ["refresh.failed", "refresh.guarded", "refresh.guarded"]
    [failed] = second.events()
    assert failed.json["refresh"]["failures_in_a_row"] == 2
