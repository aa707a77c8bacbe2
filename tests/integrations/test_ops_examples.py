"""examples/ops: the Grafana dashboard asks only for metrics a real `kl serve` exports (read from its
live /metrics after a few states, refreshes with the real null provider, a provider limit, a
notification and a discovery run, so every series exists); the health checks the container and the
systemd units use pass against a real kl serve and kl worker and fail once they stop; the units
pass `systemd-analyze verify`, and every kl command line in the units and the Containerfile is one
kl's parser accepts."""
from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kit.kl import kl_env, run_kl
from kit.klserve import KlServe
from kit.paths import PLUGIN_CACHE, REPO
from kit.procs import assert_no_new_providers, provider_pids

OPS = REPO / "examples" / "ops"
HEALTHCHECK = OPS / "healthcheck.py"
TOKEN = "ops-test-token"
# PromQL words that are not metric names: functions, aggregations, keywords.
PROMQL_WORDS = {"sum", "count", "min", "max", "avg", "topk", "bottomk", "rate", "increase", "irate", "time", "vector",
                "histogram_quantile", "by", "without", "on", "ignoring", "or", "and", "unless", "le", "offset",
                "label_values", "bool", "group_left", "group_right"}


def dashboard_metrics(dashboard: dict) -> dict[str, set[str]]:
    """Every metric name each PromQL expression of the dashboard (panels, nested rows, template
    variables) uses, by expression."""
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "definition") and isinstance(value, str):
                    exprs.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    found = {}
    for expr in exprs:
        bare = re.sub(r"label_values\(([^,)]+),[^)]*\)", r"\1", expr)  # its second argument is a label
        # Label matchers ({state=~"$state"}), strings, durations ([1h]) and label lists (by (...)) name no metric.
        bare = re.sub(r'"[^"]*"', "", bare)
        bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
        bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
        names = {w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare) if w not in PROMQL_WORDS}
        found[expr] = names
    return found


def exported(text: str) -> set[str]:
    """The sample names of an exposition that have at least one sample."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def populated(db_url: str, make_state, tmp_path: Path) -> str:
    """States, refreshes (one failed), a provider limit, a notification delivery and a discovery run."""
    for name in ("prod", "staging"):
        r = run_kl("state", "import", name, "-", input=make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}))
        assert r.returncode == 0, r.stderr
    before = provider_pids()
    r = run_kl("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--workdir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    # Its refresh.failed goes to a receiver that is not there: the delivery stays pending.
    r = run_kl("notify", "add", "ops", "--webhook", "http://127.0.0.1:9/hook", "--events", "refresh.failed")
    assert r.returncode == 0, r.stderr
    r = run_kl("refresh", "staging", "--provider-search-path", str(tmp_path), "--workdir", str(tmp_path),
               env={"KL_NOTIFY_WAIT": "0"})
    assert r.returncode == 1, r.stderr
    assert_no_new_providers(before)
    r = run_kl("provider", "limit", "hashicorp/null", "--max-in-flight", "4")
    assert r.returncode == 0, r.stderr
    import psycopg

    from kilolock.store import discovery_runs as dr

    with psycopg.connect(db_url, autocommit=True) as conn:
        scope = dr.Scope("registry.terraform.io/kilolock/testfw", "", "prod", "testfw_thing", {})
        run = dr.begin(conn, scope, None, "t")
        dr.finish(conn, run, [dr.Found({"id": "x-1"}, "x-1", "unmanaged", [])], status="succeeded")
    return db_url


def test_every_metric_the_dashboard_queries_is_exported_by_kl_serve(populated: str):
    dashboard = json.loads((OPS / "grafana-dashboard.json").read_text())
    used = dashboard_metrics(dashboard)
    assert len(used) >= 10 and all(used.values()), [e for e, names in used.items() if not names]
    with KlServe(populated, "--metrics-open-on-loopback", "-q", env={"KL_SERVE_TOKEN": TOKEN}) as serve:
        # Twice: the first scrape's own request is counted in the second.
        for _ in range(2):
            with urllib.request.urlopen(f"{serve.http}/metrics", timeout=60) as reply:
                text = reply.read().decode()
    names = exported(text)
    assert "kilolock_fleet_refresh_duration_seconds_bucket" in names  # the series exist: a refresh ran
    missing = {expr: sorted(n for n in metric_names if n not in names) for expr, metric_names in used.items()}
    assert not {e: m for e, m in missing.items() if m}, "queried but not exported by kl serve"


def test_dashboard_metric_extraction_sees_every_name():
    expr = ('histogram_quantile(0.95, sum by (le, route) (rate(kilolock_http_request_duration_seconds_bucket[5m]))) '
            '/ ignoring(x) count(kilolock_state_open_drift{state=~"$state", x="sum"} > 0) or vector(0)')
    assert dashboard_metrics({"expr": expr}) == {expr: {"kilolock_http_request_duration_seconds_bucket",
                                                        "kilolock_state_open_drift"}}
    variable = "label_values(kilolock_state_last_successful_refresh_timestamp_seconds, state)"
    assert dashboard_metrics({"definition": variable}) == {variable: {"kilolock_state_last_successful_refresh_timestamp_seconds"}}


def healthcheck(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = kl_env(KL=shlex.join([sys.executable, "-m", "kilolock"]), **env)
    return subprocess.run([sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True, env=full_env,
                          timeout=180)


def test_serve_health_check_passes_while_kl_serve_answers_and_fails_after(db_url: str):
    serve = KlServe(db_url, "-q", env={"KL_SERVE_TOKEN": TOKEN})
    try:
        r = healthcheck("serve", serve.http)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"kl serve healthy at {serve.http}\n", "")
        # The container's check: the role and the address from the process's own command line.
        r = healthcheck("auto", str(serve.proc.pid))
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        assert r.stdout == f"kl serve healthy at http://127.0.0.1:{serve.port}\n"
    finally:
        serve.stop()
    r = healthcheck("serve", serve.http)
    assert r.returncode == 1 and r.stderr.startswith(f"healthcheck: {serve.http}/healthz: ") and r.stderr.count("\n") == 1


def test_worker_health_check_follows_its_heartbeat(db_url: str):
    worker = subprocess.Popen([sys.executable, "-m", "kilolock", "worker", "--name", "ops-w1", "--poll", "1s"],
                              env=kl_env(KL_DATABASE_URL=db_url), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        r = healthcheck("--wait", "60", "worker", str(worker.pid))
        assert r.returncode == 0 and r.stdout.startswith("kl worker ops-w1 alive (heartbeat "), r.stderr
        r = healthcheck("auto", str(worker.pid))
        assert r.returncode == 0 and r.stdout.startswith("kl worker ops-w1 alive"), r.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(120)
    assert worker.returncode == 0, worker.stderr.read() if worker.stderr else ""
    r = healthcheck("worker", str(worker.pid))
    assert r.returncode == 1 and r.stderr.startswith("healthcheck: kl worker ops-w1 is stopped (last heartbeat "), r.stderr


def test_health_check_of_something_else_is_one_line_and_exit_1():
    r = healthcheck("auto", str(os.getpid()))
    assert r.returncode == 1 and r.stderr.startswith(f"healthcheck: process {os.getpid()} is neither kl serve nor kl worker")
    r = healthcheck("worker", "abc")
    assert (r.returncode, r.stderr) == (1, ("healthcheck: usage: healthcheck.py [--wait SECONDS] serve [URL] | worker PID | "
                                            "auto [PID]\n"))


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(path)
    return unit


def kl_arguments(command: list[str]) -> list[str]:
    """The arguments kl gets from a command line that runs kl.pyz."""
    return command[next(i for i, w in enumerate(command) if w.endswith("kl.pyz")) + 1:]


def assert_kl_accepts(args: list[str]) -> None:
    from kilolock.cli import _parser_for

    parser, argv = _parser_for(args)
    parsed = parser.parse_args(argv)
    assert parsed._command is not None, args


@pytest.mark.parametrize("name", ["kl-serve.service", "kl-worker@.service"])
def test_systemd_units_verify_and_run_real_kl_commands(name: str, tmp_path: Path):
    path = OPS / "systemd" / name
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: install systemd (Debian: apt-get install systemd)", pytrace=False)
    # A template is verified as an instance of it, as systemd loads one.
    unit = tmp_path / name.replace("@.", "@1.")
    shutil.copyfile(path, unit)
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if unit.name in line]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr
    service = _unit(path)["Service"]
    command = shlex.split(service["ExecStart"].replace("%H", "host").replace("%i", "1"))
    assert_kl_accepts(kl_arguments(command))
    post = shlex.split(service["ExecStartPost"])
    assert post[1] == "/opt/kilolock/healthcheck.py" and post[2:4] == ["--wait", "60"]


def test_container_runs_real_kl_commands_and_its_health_check():
    text = (OPS / "Containerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    directives = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in joined.splitlines()
                  if line and not line.startswith("#") and line.split(None, 1)[0] in ("ENTRYPOINT", "CMD", "HEALTHCHECK")}
    entrypoint, cmd = json.loads(directives["ENTRYPOINT"]), json.loads(directives["CMD"])
    assert entrypoint == ["python3", "/opt/kilolock/kl.pyz"]
    assert_kl_accepts(kl_arguments(entrypoint + cmd))
    assert json.loads(directives["HEALTHCHECK"].split(" CMD ", 1)[1]) == ["python3", "/opt/kilolock/healthcheck.py", "auto"]
    # What the image copies from the checkout is there.
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, re.MULTILINE):
        assert src == "." or (REPO / src).exists(), src
