"""Chaos run for `kl refresh`: N refreshes with random faults, then the invariants that must hold
whatever happened.

Two states on a PostgreSQL cluster of the run's own (or --database-url):
- `real`: made by Terraform 1.0.3 with the real null, random and local providers; faults are
  out-of-band drift (a managed file edited), kills (SIGKILL/SIGTERM/SIGINT) at random times and
  a cut database connection and (on its own cluster) a server restart;
- `fake`: the fault-injecting fake provider (tests/provider/fake_provider.py), rewritten before
  each run as an apply would, with crashes, errors, deletions, slow reads past --timeout, kills and
  cuts.
Every run is checked on its own (exit code allowed for its fault, one `kl:` line and no traceback
on failure; when it succeeded, one observation of the version it read and Terraform's serial
unmoved, or with --commit, which some runs add, serial +1 only where something differs; no provider left), and at the end,
after `kl runs --stale`: Terraform's serials strictly increase, observations keep their base's,
every version parses, the lifecycle rows equal a re-index from scratch, no audit row left running,
no state lock left, no process left.
Exit 0 when everything held, 1 on any violation, 2 when something needed is missing.

Test-kit code: scripts/chaos.sh runs it as `python -m kit.chaos` with tests/ on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kit import invariants, procs  # the invariant checks the tests use too
from kit.faults import fake_state, install_fake
from kit.paths import LOCAL_V, PLUGIN_CACHE, RANDOM_V, REPO, TERRAFORM
from kit.tfworkspace import terraform_env

if TYPE_CHECKING:  # main() imports it only when the run makes a cluster of its own
    from kilolock.store.embedded import EmbeddedCluster

MAIN_TF = f"""
terraform {{
  required_providers {{
    null   = {{ source = "hashicorp/null", version = "2.1.2" }}
    local  = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
    random = {{ source = "hashicorp/random", version = "{RANDOM_V}" }}
  }}
}}
resource "null_resource" "n" {{
  count    = 3
  triggers = {{ index = count.index }}
}}
resource "local_file" "f" {{
  for_each = toset(["a", "b", "c", "d", "e"])
  filename = "${{path.module}}/out/${{each.key}}.txt"
  content  = "hello ${{each.key}}"
}}
resource "random_password" "p" {{ length = 12 }}
"""

# fault -> (weight, exit codes allowed). Kills may land after the run finished, hence 0 with them;
# a SIGTERM that lands during the run cancels it, 143 (docs/cli/index.md: 130 after Ctrl-C, 143 after SIGTERM).
FAKE_FAULTS = {
    "none": (2, {0}), "crash": (1, {1}), "timeout": (1, {1}), "error": (1, {1}), "gone": (1, {0}),
    "sigkill": (2, {0, -9}), "sigterm": (2, {0, 1, 143, -15}), "sigint": (2, {0, 130, -2}), "dbcut": (2, {0, 1}),
    "pgrestart": (1, {0, 1}),
}
REAL_FAULTS = {
    "none": (2, {0}), "drift": (2, {0}),
    "sigkill": (1, {0, -9}), "sigterm": (1, {0, 1, 143, -15}), "sigint": (1, {0, 130, -2}), "dbcut": (1, {0, 1}),
    "pgrestart": (1, {0, 1}),
}
FAKE_TYPES = {
    "none": ["fake_echo", "fake_sensitive", "fake_slow"], "crash": ["fake_echo", "fake_crash", "fake_slow"],
    "timeout": ["fake_echo", "fake_slow", "fake_slow"], "error": ["fake_echo", "fake_error"],
    "gone": ["fake_echo", "fake_gone", "fake_echo"],
}
KILL_TYPES = ["fake_echo", "fake_slow", "fake_slow", "fake_sensitive"]
SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}
# What a run's status must be for a fault that always lands (the others depend on timing).
WANT_STATUS = {"none": "succeeded", "gone": "succeeded", "drift": "succeeded", "crash": "failed", "error": "failed",
               "timeout": "cancelled"}


PROVIDER_LOG = re.compile(r"^(ERROR|WARNING|INFO|DEBUG) kilolock\.provider\.[\w.-]+: ")


class Missing(Exception):
    pass


@dataclass
class Chaos:
    work: Path
    url: str
    env: dict[str, str]
    mark: str
    rng: random.Random
    cluster: EmbeddedCluster | None = None  # a cluster of the run's own: only then is it restarted
    fake_cache: Path = Path()
    tf_dir: Path = Path()
    violations: list[str] = field(default_factory=list)
    outcomes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))

    # --- helpers ------------------------------------------------------------------------------

    def kl(self, *args: str, input: bytes | None = None, cwd: Path | None = None, check: bool = True,
           **env: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "kilolock", *args], input=input, capture_output=True,
                           env={**self.env, **env}, cwd=str(cwd or self.work), timeout=300)
        if check and r.returncode != 0:
            raise RuntimeError(f"kl {' '.join(args)} failed ({r.returncode}): {r.stderr.decode().strip()}")
        return r

    def serials(self, state: str) -> list[int]:
        """Terraform's serials (an observation keeps its base's)."""
        import psycopg

        with psycopg.connect(self.url) as c:
            return [r[0] for r in c.execute("SELECT v.serial FROM state_versions v JOIN states s ON s.id = v.state_id"
                                            " WHERE s.name = %s AND v.kind = 'terraform' ORDER BY v.serial", (state,))]

    def observations(self, state: str) -> list[tuple[int, int]]:
        """(serial, number) of every observation, in the order recorded."""
        import psycopg

        with psycopg.connect(self.url) as c:
            return c.execute("SELECT v.serial, v.observation_number FROM state_versions v JOIN states s ON s.id = v.state_id"
                             " WHERE s.name = %s AND v.kind = 'observation' ORDER BY v.seq", (state,)).fetchall()

    def runs(self, state: str) -> list[tuple]:
        """(status, from serial, to serial, to kind) of every run."""
        import psycopg

        with psycopg.connect(self.url) as c:
            return c.execute(
                """SELECT rr.status, f.serial, t.serial, t.kind FROM refresh_runs rr JOIN states s ON s.id = rr.state_id
                   JOIN state_versions f ON f.id = rr.from_version_id LEFT JOIN state_versions t ON t.id = rr.to_version_id
                   WHERE s.name = %s ORDER BY rr.started_at""", (state,)).fetchall()

    def restart_server(self) -> None:
        assert self.cluster is not None
        self.cluster.stop()
        self.cluster.ensure_running()

    def current_local_files(self) -> list[str]:
        import psycopg

        with psycopg.connect(self.url) as c:
            rows = c.execute("""SELECT r.attributes ->> 'filename' FROM resources r JOIN states s ON s.id = r.state_id
                                WHERE s.name = 'real' AND r.type = 'local_file' AND r.delete_serial IS NULL""").fetchall()
        return sorted(f for (f,) in rows if f)

    # --- setup --------------------------------------------------------------------------------

    def setup(self) -> None:
        for path, script in ((TERRAFORM, "scripts/test-terraform.sh"),
                             (PLUGIN_CACHE / "registry.terraform.io/hashicorp/local" / LOCAL_V, "scripts/test-providers.sh"),
                             (PLUGIN_CACHE / "registry.terraform.io/hashicorp/random" / RANDOM_V, "scripts/test-providers.sh")):
            if not path.exists():
                raise Missing(f"{path} is missing: run {script}")
        self.kl("db", "migrate")
        self.fake_cache = install_fake(self.work, self.work / "fake-events.log")
        self.kl("state", "import", "fake", "-", "--source", "apply", input=fake_state(["fake_echo"]))
        self.tf_dir = self.work / "tf"
        self.tf_dir.mkdir()
        (self.tf_dir / "main.tf").write_text(MAIN_TF)
        self.terraform("init")
        self.reapply()
        # Where each state's providers run: deletions (fake_gone, an edited local_file) commit only then.
        self.kl("state", "set", "fake", "--workdir", str(self.work))
        self.kl("state", "set", "real", "--workdir", str(self.tf_dir))

    def terraform(self, *args: str) -> None:
        r = subprocess.run([str(TERRAFORM), *args, "-input=false", "-no-color"], cwd=self.tf_dir,
                           env={**terraform_env(), **{k: v for k, v in self.env.items() if k.startswith("KL_CHAOS")}},
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"terraform {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")

    def reapply(self) -> None:
        """Terraform puts back what drift removed; its state goes in as the next version, as an
        apply through the backend would (its local serial knows nothing of kl's refreshes)."""
        self.terraform("apply", "-auto-approve")
        doc = json.loads((self.tf_dir / "terraform.tfstate").read_text())
        have = self.serials("real")
        doc["serial"] = (have[-1] + 1) if have else doc["serial"]
        self.kl("state", "import", "real", "-", "--source", "apply", input=json.dumps(doc).encode())

    # --- one run ------------------------------------------------------------------------------

    def one(self, n: int) -> None:
        target = "fake" if self.rng.random() < 0.6 else "real"
        faults = FAKE_FAULTS if target == "fake" else REAL_FAULTS
        if self.cluster is None:
            faults = {k: v for k, v in faults.items() if k != "pgrestart"}
        fault = self.rng.choices(list(faults), weights=[w for w, _ in faults.values()])[0]
        allowed = faults[fault][1]
        # Most runs record an observation, as a refresh does by default; some write serial+1 (--commit).
        commit = self.rng.random() < 0.3
        args = ["refresh", target, "--format", "json", *(["--commit"] if commit else [])]
        env: dict[str, str] = {}
        cwd = self.work
        if target == "fake":
            types = FAKE_TYPES.get(fault, KILL_TYPES)
            serial = self.serials("fake")[-1] + 1
            self.kl("state", "import", "fake", "-", "--source", "apply", input=fake_state(types, serial=serial, secret=f"s{n}"))
            args += ["--provider-search-path", str(self.fake_cache)]
            env["FAKE_SLOW_SECONDS"] = {"timeout": "6", "none": "0.2"}.get(fault, "1")
            if fault == "timeout":
                args += ["--timeout", "1s"]
        else:
            if len(self.current_local_files()) < 3:
                self.reapply()
            if fault == "drift":
                victim = Path(self.rng.choice(self.current_local_files()))
                victim = victim if victim.is_absolute() else self.tf_dir / victim
                victim.write_text(f"edited behind Terraform's back in run {n}\n")
            args += ["--provider-search-path", str(PLUGIN_CACHE)]
            cwd = self.tf_dir
        before, runs_before, observed_before = self.serials(target), len(self.runs(target)), self.observations(target)
        orphans_before = procs.marked_pids(self.mark, names=(b"terraform-provider-", b"fake_provider.py", b"-m\0kilolock"))

        # default_signals: the kill faults must land even when chaos.sh runs in the background (`&`
        # starts it with SIGINT ignored, and kl's children would inherit that).
        proc = subprocess.Popen([sys.executable, "-m", "kilolock", *args], env={**self.env, **env}, cwd=str(cwd),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=procs.default_signals)  # noqa: PLW1509 - signal() only
        delay = self.rng.uniform(0.3, 3.0)
        if fault in SIGNALS:
            def signal_if_running() -> None:
                if proc.poll() is None:
                    proc.send_signal(SIGNALS[fault])

            timer = threading.Timer(delay, signal_if_running)
        elif fault == "dbcut":
            timer = threading.Timer(delay, invariants.terminate_kl_backends, args=(self.url,))
        elif fault == "pgrestart":
            timer = threading.Timer(delay, self.restart_server)
        else:
            timer = None
        if timer:
            timer.start()
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            self.violations.append(f"run {n} {target}:{fault}: kl refresh hung for 180 s")
        if timer:
            timer.join()
        code, text = proc.returncode, err.decode()
        where = f"run {n} {target}:{fault}{' --commit' if commit else ''} (delay {delay:.2f}s, exit {code})"

        new_runs = self.runs(target)[runs_before:]
        after, observed = self.serials(target), self.observations(target)
        status = new_runs[0][0] if new_runs else "no-run"
        self.outcomes[f"{target}:{fault}"][status if code >= 0 else f"{status} (killed)"] += 1
        new_observations = observed[len(observed_before):]
        if observed[:len(observed_before)] != observed_before:
            bad_early = f"observations changed under the run: {observed_before[-3:]} -> {observed[-3:]}"
        else:
            bad_early = None

        def bad(what: str) -> None:
            self.violations.append(f"{where}: {what}")

        if bad_early:
            bad(bad_early)
        if code not in allowed:
            bad(f"exit code not one of {sorted(allowed)}; stderr: {text.strip()[:300]}")
        if "Traceback" in text or "internal error" in text:
            bad(f"traceback or internal error: {text.strip()[:300]}")
        # kl's own words are one `kl:` line; a crashing provider's last stderr lines are logged
        # above it (as Terraform shows a provider's panic), through kl's provider loggers.
        lines = [ln for ln in text.splitlines() if ln.strip() and not PROVIDER_LOG.match(ln)]
        if code > 0 and (len(lines) != 1 or not lines[0].startswith("kl: ")):
            bad(f"not one 'kl:' line on stderr: {text.strip()[:300]}")
        if fault in WANT_STATUS and status != WANT_STATUS[fault]:
            bad(f"status {status}, expected {WANT_STATUS[fault]}; stderr: {text.strip()[:300]}")
        if fault in ("dbcut", "pgrestart") and code == 1 and not any(
                m in text for m in ("lost the database connection", "cannot connect to the database")):
            bad(f"a cut connection not reported as such: {text.strip()[:300]}")
        if len(new_runs) > 1:
            bad(f"{len(new_runs)} audit rows for one run")
        # --commit writes serial+1 only where what it read differs; else a confirmation, checked as one.
        if status == "succeeded" and commit and not (new_runs and new_runs[0][3] == "observation"):
            if after != before + [before[-1] + 1] or new_runs[0][2:] != (before[-1] + 1, "terraform") or new_observations:
                bad(f"succeeded but serials went {before[-3:]} -> {after[-3:]}, observations {new_observations}")
        elif status == "succeeded":
            if after != before or len(new_observations) != 1 or new_observations[0][0] != before[-1] \
                    or new_runs[0][2:] != (before[-1], "observation"):
                bad(f"succeeded but serials went {before[-3:]} -> {after[-3:]}, observations {new_observations}")
        elif status == "running":
            if after not in ((before, before + [before[-1] + 1]) if commit else (before,)) or len(new_observations) > (
                    0 if commit else 1):
                bad(f"killed run moved serials {before[-3:]} -> {after[-3:]}, observations {new_observations}")
        elif after != before or new_observations:
            bad(f"status {status} yet serials went {before[-3:]} -> {after[-3:]}, observations {new_observations}")
        if status == "running" and code >= 0 and "--stale" not in text:
            bad("kl exited by itself, left its audit row running, and did not say to run `kl runs --stale`")
        if status == "running":
            self.recover(target, bad)
        names = (b"terraform-provider-", b"fake_provider.py", b"-m\0kilolock")
        left = procs.settle_orphans(orphans_before, self.mark, timeout=5, names=names)
        if left:
            bad(f"processes left: {sorted(left)}")
            for pid in left:  # do not let one leak poison the next runs' counts
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def recover(self, state: str, bad) -> None:
        """What an operator does after a refresh died: `kl runs --stale`, once the dead process's
        database backend is gone too. Afterwards its row is finished and its lock (if it died inside
        the commit) released."""
        try:
            invariants.wait_for(lambda: not invariants.kl_backends(self.url), 30, "the dead kl's backend to end")
        except AssertionError as exc:
            bad(str(exc))
        r = self.kl("runs", state, "--stale", check=False)
        self.outcomes["recovery"]["kl runs --stale"] += 1
        if r.returncode != 0 or "1 stale run(s) marked failed" not in r.stderr.decode():
            bad(f"kl runs --stale did not finish the dead run: {r.stderr.decode().strip()}")
        if invariants.running_runs(self.url):
            bad("an audit row still running after kl runs --stale")
        if invariants.state_locks(self.url):
            bad(f"a lock left after kl runs --stale: {invariants.state_locks(self.url)}")
        else:
            self.outcomes["recovery"]["no lock left"] += 1

    # --- the end ------------------------------------------------------------------------------

    def invariants(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for state in ("fake", "real"):
            stale = self.kl("runs", state, "--stale", check=False)
            found[f"{state}: kl runs --stale"] = [] if stale.returncode == 0 else [stale.stderr.decode().strip()]
            found[f"{state}: serials increase, observations keep theirs, versions parse"] = \
                invariants.version_problems(self.url, state)
            found[f"{state}: lifecycles = re-index"] = invariants.reindex_mismatches(self.url, state)
            pulled = self.kl("state", "pull", state, check=False)
            ok = pulled.returncode == 0 and json.loads(pulled.stdout)["serial"] == self.serials(state)[-1]
            found[f"{state}: kl state pull"] = [] if ok else [pulled.stderr.decode().strip() or "wrong serial"]
            observed = self.observations(state)
            if observed:  # the latest observation is what `kl state pull --observed` prints
                pulled = self.kl("state", "pull", state, "--observed", check=False)
                ok = pulled.returncode == 0 and json.loads(pulled.stdout)["serial"] == observed[-1][0]
                found[f"{state}: kl state pull --observed"] = [] if ok else [
                    pulled.stderr.decode().strip() or "wrong serial"]
        found["audit rows finished"] = [f"run {r[0]} still running" for r in invariants.running_runs(self.url)]
        found["no state lock left"] = [f"{s} locked by {w} ({o})" for s, o, w in invariants.state_locks(self.url)]
        names = (b"terraform-provider-", b"fake_provider.py", b"-m\0kilolock")
        found["no processes left"] = [f"pid {p}" for p in sorted(procs.settle_orphans(set(), self.mark, 5, names))]
        return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chaos.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="refresh runs (default 30)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--database-url", help="a server to use instead of a cluster of the run's own (a fresh database is made on it)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (and its cluster's data)")
    ap.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kl-chaos-"))
    os.chmod(work, 0o755)  # the embedded cluster runs as an unprivileged account under root
    mark_value = uuid.uuid4().hex
    cluster = None
    admin_db = None
    try:
        if args.database_url:
            import psycopg
            import psycopg.conninfo

            admin_db = f"kl_chaos_{mark_value[:12]}"
            with psycopg.connect(args.database_url, autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{admin_db}"')
            url = psycopg.conninfo.make_conninfo(args.database_url, dbname=admin_db)
        else:
            from kilolock.store.embedded import EmbeddedCluster

            cluster = EmbeddedCluster(work / "pg")
            url = cluster.ensure_running()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               "KL_DATABASE_URL": url, "KL_CHAOS_RUN": mark_value}
        env.pop("KL_DEBUG", None)
        chaos = Chaos(work=work, url=url, env=env, mark=f"KL_CHAOS_RUN={mark_value}", rng=random.Random(seed), cluster=cluster)
        os.environ["KL_CHAOS_RUN"] = mark_value  # terraform's providers carry the mark too
        chaos.setup()
        for n in range(1, args.runs + 1):
            chaos.one(n)
            if n % 10 == 0:
                print(f"chaos: {n}/{args.runs} runs, {len(chaos.violations)} violation(s)", file=sys.stderr, flush=True)
        found = chaos.invariants()
    except Missing as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    finally:
        if cluster is not None and not args.keep:
            cluster.stop()
        if admin_db and args.database_url:
            import psycopg

            with psycopg.connect(args.database_url, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{admin_db}" WITH (FORCE)')
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - started
    ok = not chaos.violations and not any(found.values())
    print(f"chaos: {args.runs} runs, seed {seed}, {elapsed:.0f}s")
    print("outcomes per fault (audit status; '(killed)' = kl died by the signal):")
    for key in sorted(chaos.outcomes):
        print(f"  {key:16} " + ", ".join(f"{s} {c}" for s, c in sorted(chaos.outcomes[key].items())))
    print("invariants:")
    for name, problems in found.items():
        print(f"  {'ok  ' if not problems else 'FAIL'} {name}" + "".join(f"\n         {p}" for p in problems[:10]))
    print(f"per-run checks: {'ok' if not chaos.violations else 'FAIL'} ({len(chaos.violations)} violation(s))")
    for v in chaos.violations[:30]:
        print(f"  {v}")
    print(f"chaos: {'OK' if ok else 'FAILED'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "runs": args.runs, "seed": seed, "seconds": round(elapsed, 1), "ok": ok,
            "outcomes": {k: dict(v) for k, v in chaos.outcomes.items()},
            "invariants": found, "violations": chaos.violations,
        }, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
