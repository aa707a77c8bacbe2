"""Secrets against a provider that repeats what it is given (the fake, with its echo switches): a
config token from {"env": ...}, a schema-sensitive attribute and a value marked only through
`sensitive_attributes` must come out as (sensitive) in provider logs, the stderr tail of a crash,
diagnostics, kl drift and the JSON API, and must reach no table.

Extends tests/refresh/test_refresh_faults.py::test_provider_config_env_reference_is_resolved_at_run_time_and_never_stored
(which checks provider_configs and the stored state) to every table, debug logs, and a provider
that echoes the token. The real-provider side is test_secrets_real.py."""
from __future__ import annotations

import json
import uuid

from kit.faults import FAKE_SOURCE
from kit.leaks import LOUD, STATE_TABLES, api_channels, db_rows, leaks, read_channels


def planted() -> dict[str, str]:
    tag = uuid.uuid4().hex[:12]
    return {"env token": f"KLTOKEN-{tag}", "schema-sensitive secret": f"KLSECRET-{tag}",
            "marked value": f"KLMARKED-{tag}"}


def secret_state(types: list[str], s: dict[str, str], serial: int = 1) -> bytes:
    """Fake instances whose `secret` is schema-sensitive and whose `value` is sensitive only by a mark."""
    return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": "secret-lineage", "outputs": {},
                       "resources": [{"mode": "managed", "type": t, "name": f"r{n}", "provider": f'provider["{FAKE_SOURCE}"]',
                                      "instances": [{"schema_version": 2,
                                                     "sensitive_attributes": [[{"type": "get_attr", "value": "value"}]],
                                                     "attributes": {"id": f"plain-id-{n}", "value": s["marked value"],
                                                                    "secret": s["schema-sensitive secret"], "rule": []}}]}
                                     for n, t in enumerate(types)]}).encode()


def configure_env_token(run_kl) -> None:
    r = run_kl("provider", "configure", "hashicorp/fake", "--config", "-", input=b'{"token": {"env": "FAKE_TOKEN"}}')
    assert r.returncode == 0, r.stderr


def refresh(run_kl, cache, s: dict[str, str], fmt: str, **env: str):
    return run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", fmt, "--provider-parallelism", "1",
                  env={**LOUD, "FAKE_TOKEN": s["env token"], **env})


def test_provider_echoes_of_token_and_sensitive_values_are_masked_in_logs_and_output(run_kl, db_url, fake_cache):
    s = planted()
    make, events = fake_cache
    cache = make(FAKE_ECHO_CONFIG_TO_STDERR="1", FAKE_ECHO_STATE_TO_STDERR="1")
    assert run_kl("state", "import", "prod", "-", input=secret_state(["fake_echo", "fake_echo"], s)).returncode == 0
    configure_env_token(run_kl)
    channels = {}
    for fmt in ("table", "json"):
        r = refresh(run_kl, cache, s, fmt)
        assert r.returncode == 0, r.stderr
        channels[f"kl refresh --format {fmt}"] = r.stdout + r.stderr
        log = r.stderr.decode()
        # The fake did echo (the token reached it, its lines reached kl's log) and kl masked it,
        # while the rest of the line, a plain id included, is still shown.
        assert f"configure token={s['env token']}" in events.read_text()
        assert "configured with token (sensitive)" in log and "token='(sensitive)'" in log, log
        assert "'secret': '(sensitive)'" in log and "'value': '(sensitive)'" in log and "plain-id-1" in log, log
    channels |= read_channels(run_kl, "prod")
    api, _ = api_channels(db_url, "prod")
    channels |= api
    # The env token was never in the state: no table may hold it, the state tables included.
    assert leaks({"env token": s["env token"]}, db_rows(db_url, exclude=frozenset())) == []
    channels |= db_rows(db_url)
    assert leaks(s, channels) == []
    for pull in (("state", "pull", "prod"), ("state", "pull", "prod", "--observed")):
        pulled = run_kl(*pull).stdout.decode()  # the state itself, and what was observed of it, hold them by design
        assert s["schema-sensitive secret"] in pulled and s["marked value"] in pulled and s["env token"] not in pulled, pull


def test_a_literal_schema_sensitive_config_token_is_masked_when_echoed(run_kl, db_url, fake_cache):
    token = f"KLLITERAL-{uuid.uuid4().hex[:12]}"
    make, _ = fake_cache
    cache = make(FAKE_ECHO_CONFIG_TO_STDERR="1")
    assert run_kl("state", "import", "prod", "-", input=secret_state(["fake_echo"], planted())).returncode == 0
    r = run_kl("provider", "configure", "hashicorp/fake", "--config", "-", input=json.dumps({"token": token}).encode())
    assert r.returncode == 0 and token not in r.stdout.decode(), r.stdout
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), env=LOUD)
    assert r.returncode == 0, r.stderr
    assert "configured with token (sensitive)" in r.stderr.decode(), r.stderr
    channels = {"kl refresh": r.stdout + r.stderr, **read_channels(run_kl, "prod")}
    assert leaks({"literal token": token}, channels) == []


def test_crash_tail_and_diagnostics_quoting_secrets_are_masked_in_failures_and_the_audit_row(run_kl, db_url, fake_cache):
    s = planted()
    make, _ = fake_cache
    cache = make(FAKE_ECHO_STATE_TO_STDERR="1", FAKE_ECHO_STATE_IN_DIAGNOSTIC="1")
    assert run_kl("state", "import", "prod", "-", input=secret_state(["fake_error", "fake_crash"], s)).returncode == 0
    configure_env_token(run_kl)
    r = refresh(run_kl, cache, s, "json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed", out
    failures = {f["address"]: f["message"] for f in out["failures"]}
    # The crash's stderr tail and the diagnostic detail quote the prior state: masked, still useful.
    assert "plugin exited" in failures["fake_crash.r1"] and "stderr:" in failures["fake_crash.r1"], failures
    assert "'secret': '(sensitive)'" in failures["fake_crash.r1"] and "panic: fake provider crashed" in failures["fake_crash.r1"]
    assert "the rule is wrong (secret was '(sensitive)')" in failures["fake_error.r0"], failures
    table = refresh(run_kl, cache, s, "table")
    assert table.returncode == 1 and b"(sensitive)" in table.stdout, table.stdout
    channels = {"kl refresh --format json": r.stdout + r.stderr, "kl refresh": table.stdout + table.stderr,
                **read_channels(run_kl, "prod"), **db_rows(db_url)}
    assert "(sensitive)" in channels["table refresh_runs"].decode()  # the error_summary is there, masked
    api, _ = api_channels(db_url, "prod")
    assert leaks(s, channels | api) == []


def test_drift_of_sensitive_values_shows_only_that_they_changed(run_kl, db_url, fake_cache):
    s = planted()
    new = {"new secret": f"KLNEWSECRET-{uuid.uuid4().hex[:12]}", "new marked": f"KLNEWMARKED-{uuid.uuid4().hex[:12]}"}
    make, _ = fake_cache
    cache = make(FAKE_READ_SET=json.dumps({"secret": new["new secret"], "value": new["new marked"]}))
    assert run_kl("state", "import", "prod", "-", input=secret_state(["fake_echo"], s)).returncode == 0
    configure_env_token(run_kl)
    r = refresh(run_kl, cache, s, "table")
    assert r.returncode == 0 and b"fake_echo.r0" in r.stdout, r.stdout + r.stderr
    drift = json.loads(run_kl("drift", "prod", "--format", "json").stdout)
    changes = {c["path"]: (c["before"], c["after"]) for c in drift["drift"][0]["changes"]}
    assert changes == {"secret": ("(sensitive)", "(sensitive)"), "value": ("(sensitive)", "(sensitive)")}, changes
    text = run_kl("drift", "prod").stdout.decode()
    assert "  secret: (sensitive) → (sensitive)" in text and "  value: (sensitive) → (sensitive)" in text, text
    # kl refresh's own table shows the same changes, masked the same.
    assert b"    secret: (sensitive) \xe2\x86\x92 (sensitive)" in r.stdout, r.stdout
    channels = {"kl refresh": r.stdout + r.stderr, **read_channels(run_kl, "prod"), **db_rows(db_url)}
    api, _ = api_channels(db_url, "prod")
    api_drift = json.loads(api["GET /api/v1/states/prod/drift"])["drift"][0]["changes"]
    assert {c["path"]: (c["before"], c["after"]) for c in api_drift} == changes
    assert leaks(s | new, channels | api) == []
    pulled = json.loads(run_kl("state", "pull", "prod", "--observed").stdout)["resources"][0]["instances"][0]
    assert pulled["attributes"]["secret"] == new["new secret"]  # it did change, in what the refresh observed
    assert sorted(p[0]["value"] for p in pulled["sensitive_attributes"]) == ["secret", "value"]
    assert not set(STATE_TABLES) & {k.removeprefix("table ") for k in channels}


def test_kl_credentials_stay_out_of_the_provider_environment(run_kl, db_url, fake_cache):
    make, events = fake_cache
    cache = make(FAKE_REPORT_ENV="KL_DATABASE_URL,KL_SERVE_TOKEN,KL_SERVE_ADMIN_TOKEN,FAKE_TOKEN")
    assert run_kl("state", "import", "prod", "-", input=secret_state(["fake_echo"], planted())).returncode == 0
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache),
               env={"KL_SERVE_TOKEN": "serve-token", "KL_SERVE_ADMIN_TOKEN": "admin-token", "FAKE_TOKEN": "provider-cred"})
    assert r.returncode == 0, r.stderr
    reported = [line for line in events.read_text().splitlines() if line.startswith("env ")]
    # The provider keeps the environment its own credentials come from, and gets none of kl's.
    assert reported == ["env KL_DATABASE_URL=unset", "env KL_SERVE_TOKEN=unset", "env KL_SERVE_ADMIN_TOKEN=unset",
                        "env FAKE_TOKEN=set"], reported
