#!/usr/bin/env bash
# The main job on a fresh machine: a real Terraform state, refreshed out-of-band by kl against the
# real provider binaries, on kl's embedded default database.
#   1. installs only what the demo uses (scripts/setup-dev.sh: PostgreSQL binaries, .venv with kl and
#      its Rust codec but no test extras, the null and local providers, Terraform 1.0.3); what the
#      installers print goes to $KL_DEMO_DIR/setup.log, shown only when something fails
#   2. applies a small configuration with Terraform 1.0.3 (null + local providers, offline mirror)
#   3. imports the state into kl, changes the world behind Terraform's back (deletes a file that
#      a local_file resource manages), runs `kl refresh`, and shows `kl drift` and `kl status`
#   4. says how to run kl yourself on the same state
# KL_DEMO_DIR (default ~/.cache/kilolock-demo) holds the Terraform workspace; KL_TEST_CACHE (default
# ~/.cache/kilolock-test) the providers and Terraform; KL_DATABASE_URL, if set, is used instead of
# the embedded database.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
demo="${KL_DEMO_DIR:-$HOME/.cache/kilolock-demo}"
mkdir -p "$demo"
demo="$(cd "$demo" && pwd)"

echo "demo: installing what the demo uses (the first run takes a few minutes; details in $demo/setup.log)"
KL_SETUP_EXTRAS="" KL_SETUP_PROVIDERS="null local" KL_SETUP_TERRAFORMS=terraform-1.0.3 \
    KL_SETUP_LOG="$demo/setup.log" bash "$repo/scripts/setup-dev.sh"

kl_bin="$repo/.venv/bin/kl"
kl() { "$kl_bin" "$@"; }
terraform="$cache/bin/terraform-1.0.3"
export TF_CLI_CONFIG_FILE="$cache/terraformrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1

cd "$demo"
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
  for_each = toset(["a", "b", "c", "d", "e"])
  filename = "${path.module}/out/${each.key}.conf"
  content  = "setting = ${each.key}\n"
}
TF
    echo "demo: terraform apply (Terraform 1.0.3, offline provider mirror) in $demo"
    "$terraform" init -input=false >/dev/null
    "$terraform" apply -input=false -auto-approve >/dev/null
fi

if ! kl status demo >/dev/null 2>&1; then
    echo "demo: kl state import demo terraform.tfstate"
    kl state import demo terraform.tfstate --source apply
fi
# Stored with the state, so `kl refresh demo` works the same from any directory.
echo "demo: kl state set demo --workdir $demo --provider-search-path $cache/plugin-cache"
kl state set demo --workdir "$demo" --provider-search-path "$cache/plugin-cache" >/dev/null
if [ -f out/b.conf ]; then
    echo "demo: deleting out/b.conf behind Terraform's back"
    rm out/b.conf
fi
echo "demo: kl refresh demo"
kl refresh demo
echo
echo "demo: kl drift demo"
kl drift demo
echo
echo "demo: kl status demo"
kl status demo
echo
echo "Run kl yourself (same database; the state refreshes from any directory):"
echo "  $kl_bin drift demo"
echo "  rm $demo/out/a.conf && $kl_bin refresh demo     # another change behind Terraform's back"
echo "  $kl_bin drift accept demo --dry-run          # a refresh only observes: accept writes it for Terraform"
echo "  $kl_bin state versions demo; $kl_bin --help"
echo "  (or: source $repo/.venv/bin/activate, then kl ...)"
