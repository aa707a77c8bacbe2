#!/usr/bin/env bash
# "What drifted?" two ways, on a real three-resource Terraform state:
#   a. raw state files: Terraform's own refresh-only run, then a jq join of the before/after
#      states in user space to find what changed or disappeared;
#   b. Kilolock: `kl refresh`, then one SELECT on current_resource_drift.
# The out-of-band change is real: a file that a local_file resource manages is edited behind
# Terraform's back (the local provider then reports the object as gone).
# Needs scripts/setup-dev.sh (Terraform 1.0.3, providers, .venv); jq and psql (Debian: jq,
# postgresql-client). Uses a throwaway embedded database.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
py="$repo/.venv/bin/python"
[ -x "$py" ] || { echo "drift-demo: run scripts/setup-dev.sh first" >&2; exit 1; }
for tool in jq psql; do command -v "$tool" >/dev/null || { echo "drift-demo: needs $tool (apt-get install jq postgresql-client)" >&2; exit 1; }; done
cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
tf="$cache/bin/terraform-1.0.3"
export TF_CLI_CONFIG_FILE="$cache/terraformrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1
unset KL_DATABASE_URL
work=$(mktemp -d /tmp/kl-drift-demo-XXXXXX); chmod 755 "$work"
export KL_DATA_DIR="$work/kl"
kl() { "$py" -m kilolock "$@"; }
trap 'kl db stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
now() { date +%s.%N; }

mkdir -p "$work/tf" && cd "$work/tf"
cat > main.tf <<'TF'
terraform {
  required_providers {
    null  = { source = "hashicorp/null", version = "2.1.2" }
    local = { source = "hashicorp/local", version = "1.4.1-0.20260513075820-3561e410f9fe" }
  }
}
resource "local_file" "app_config" {
  filename = "${path.module}/app.conf"
  content  = "replicas = 3\n"
}
resource "local_file" "motd" {
  filename = "${path.module}/motd.txt"
  content  = "welcome\n"
}
resource "null_resource" "deploy" {
  triggers = { config = local_file.app_config.id }
}
TF
"$tf" init -input=false >/dev/null && "$tf" apply -input=false -auto-approve >/dev/null
kl state import demo terraform.tfstate --source apply >/dev/null
kl state set demo --workdir . >/dev/null   # its local_file paths are relative to this directory
cp terraform.tfstate before.tfstate

echo "out-of-band: someone edits app.conf by hand"
echo "replicas = 5" > app.conf
echo

echo "== a. raw state files: terraform apply -refresh-only, then a jq join of before/after"
t0=$(now)
"$tf" apply -input=false -refresh-only -auto-approve >/dev/null
cp terraform.tfstate after.tfstate
jq -n --slurpfile before before.tfstate --slurpfile after after.tfstate '
  def addrs($s): [$s.resources[] | select(.mode == "managed") | . as $r | .instances[] |
    {key: ($r.type + "." + $r.name + (if .index_key == null then "" else "[" + (.index_key | tojson) + "]" end)), value: .attributes}]
    | from_entries;
  addrs($before[0]) as $b | addrs($after[0]) as $a |
  [$b | keys[] | select($a[.] == null) | {address: ., kind: "deleted"}] +
  [$b | keys[] | select($a[.] != null and $a[.] != $b[.]) | {address: ., kind: "changed"}]
  | .[] | "\(.address)\t\(.kind)"' -r
t1=$(now)
cp before.tfstate terraform.tfstate  # undo Terraform's write, so kl refreshes the same state
echo

echo "== b. Kilolock: kl refresh, then one SELECT"
t2=$(now)
kl refresh demo >/dev/null
url=$(kl db status | sed -n 's/^database  embedded (\(.*\))$/\1/p')
psql "$url" -At -F $'\t' -c "SELECT address, drift_kind FROM current_resource_drift WHERE state_name = 'demo' ORDER BY address"
t3=$(now)
echo
"$py" -c 'import sys; a, b, c, d = map(float, sys.argv[1:]); print(f"timings: raw files + jq {b - a:.2f}s, kl refresh + SELECT {d - c:.2f}s")' "$t0" "$t1" "$t2" "$t3"
echo "Both tools ran the same provider binaries on the same state; the kl answer stays queryable"
echo "(SELECT … FROM current_resource_drift) until an apply, or a refresh that reads it back, resolves it."
