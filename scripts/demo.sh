#!/usr/bin/env bash
# The main job on a fresh machine: a real Terraform state, refreshed out-of-band by kl against the
# real provider binaries, on kl's embedded default database.
#   1. installs what is missing (scripts/setup-dev.sh: PostgreSQL binaries, .venv, providers, Terraform 1.0.3)
#   2. applies a small configuration with Terraform 1.0.3 (null + local providers, offline mirror)
#   3. imports the state into kl, changes the world behind Terraform's back (deletes a file that
#      a local_file resource manages), runs `kl refresh`, and shows `kl drift` and `kl status`
# KL_DEMO_DIR (default ~/.cache/kilolock-demo) holds the Terraform workspace; KL_DATABASE_URL, if
# set, is used instead of the embedded database.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
KL_SETUP_TERRAFORMS=terraform-1.0.3 bash "$repo/scripts/setup-dev.sh"
cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
demo="${KL_DEMO_DIR:-$HOME/.cache/kilolock-demo}"
kl() { "$repo/.venv/bin/python" -m kilolock "$@"; }
export TF_CLI_CONFIG_FILE="$cache/terraformrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1

mkdir -p "$demo" && cd "$demo"
if [ ! -f terraform.tfstate ]; then
    cat > main.tf <<'TF'
terraform {
  required_providers {
    null  = { source = "hashicorp/null", version = "2.1.2" }
    local = { source = "hashicorp/local", version = "1.4.1-0.20260513075820-3561e410f9fe" }
  }
}
resource "null_resource" "web" {
  count    = 3
  triggers = { index = count.index }
}
resource "local_file" "config" {
  for_each = toset(["a", "b", "c"])
  filename = "${path.module}/out/${each.key}.conf"
  content  = "setting = ${each.key}\n"
}
TF
    echo "demo: terraform apply (Terraform 1.0.3, offline provider mirror) in $demo"
    "$cache/bin/terraform-1.0.3" init -input=false >/dev/null
    "$cache/bin/terraform-1.0.3" apply -input=false -auto-approve >/dev/null
fi

if ! kl status demo >/dev/null 2>&1; then
    echo "demo: kl state import demo terraform.tfstate"
    kl state import demo terraform.tfstate --source apply
fi
echo "demo: kl state set demo --workdir $demo (providers run there; deletions are committed only with a workdir)"
kl state set demo --workdir "$demo" >/dev/null
if [ -f out/b.conf ]; then
    echo "demo: deleting out/b.conf behind Terraform's back"
    rm out/b.conf
fi
echo "demo: kl refresh demo"
kl refresh demo --provider-search-path "$cache/plugin-cache"
echo
echo "demo: kl drift demo"
kl drift demo
echo
echo "demo: kl status demo"
kl status demo
