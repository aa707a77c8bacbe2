#!/usr/bin/env bash
# The ADR 0006 smoke test: import a real Terraform-made state, `kl refresh --dry-run`, then
# `kl refresh`, asserting on refresh_runs and on state_versions.source='refresh'.
# Runs on a throwaway embedded database unless KL_DATABASE_URL is set. Needs scripts/setup-dev.sh.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="$repo/.venv/bin/python"
[ -x "$py" ] || { echo "smoke: run scripts/setup-dev.sh first" >&2; exit 1; }
cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
kl() { "$py" -m kilolock "$@"; }
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }

if [ -z "${KL_DATABASE_URL:-}" ]; then
    export KL_DATA_DIR; KL_DATA_DIR=$(mktemp -d /tmp/kl-smoke-XXXXXX); chmod 755 "$KL_DATA_DIR"
    trap 'kl db stop >/dev/null 2>&1 || true; rm -rf "$KL_DATA_DIR"' EXIT
fi
name="smoke-$$"
state="$repo/tests/fixtures/states/varied.tfstate"
serial=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["serial"])' "$state")

kl state import "$name" "$state" --source apply >/dev/null
kl refresh "$name" --dry-run --provider-search-path "$cache/plugin-cache" >/dev/null || fail "dry run failed"
kl runs "$name" --format json | "$py" -c '
import json, sys
runs = json.load(sys.stdin)["runs"]
assert len(runs) == 1, runs
r = runs[0]
assert r["status"] == "succeeded" and r["to_serial"] is None and r["resources_failed"] == 0, r
assert r["resources_checked"] > 0 and r["finished_at"], r
' || fail "dry run: refresh_runs row not as expected"
kl state versions "$name" --format json | "$py" -c '
import json, sys
v = json.load(sys.stdin)["versions"]
assert [x["source"] for x in v] == ["apply"], v
' || fail "dry run wrote a version"

kl refresh "$name" --provider-search-path "$cache/plugin-cache" >/dev/null || fail "refresh failed"
kl runs "$name" --format json | "$py" -c '
import json, sys
r = json.load(sys.stdin)["runs"][0]
assert r["status"] == "succeeded" and r["to_serial"] is None and r["observation"] == "v%s.1" % sys.argv[1], r
' "$serial" || fail "refresh: refresh_runs row not as expected"
kl state versions "$name" --format json | "$py" -c '
import json, sys
v = json.load(sys.stdin)["versions"]
assert [(x["source"], x["kind"]) for x in v] == [("apply", "terraform"), ("refresh", "observation")], v
assert v[1]["serial"] == v[0]["serial"], v
' || fail "refresh: no observation (state_versions row of kind observation, source=refresh)"
echo "smoke: OK (import, refresh --dry-run, refresh; refresh_runs and its observation as expected)"
