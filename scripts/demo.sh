#!/usr/bin/env bash
# The main job on a fresh machine: a real Terraform state, refreshed out-of-band by kl against the
# real provider binaries, on kl's embedded default database.
#   1. installs only what the demo uses (scripts/setup-dev.sh: PostgreSQL binaries, .venv with kl and
#      its Rust codec but no test extras, the local provider and the project's SDKv2 test provider,
#      Terraform 1.0.3); what the installers print goes to $KL_DEMO_DIR/setup.log, shown only when
#      something fails
#   2. applies a small configuration with Terraform 1.0.3 (offline mirror): two "servers" of the test
#      provider, kept as JSON files it reads back attribute by attribute, and local files
#   3. imports the state into kl, changes the world behind Terraform's back (edits a server's tag,
#      deletes a file), runs `kl refresh`, and shows `kl drift` (the tag's before -> after, the file
#      deleted) and `kl status`
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
KL_SETUP_EXTRAS="" KL_SETUP_PROVIDERS="local testsdk" KL_SETUP_TERRAFORMS=terraform-1.0.3 \
    KL_SETUP_LOG="$demo/setup.log" bash "$repo/scripts/setup-dev.sh"

kl_bin="$repo/.venv/bin/kl"
kl() { "$kl_bin" "$@"; }
terraform="$cache/bin/terraform-1.0.3"
export TF_CLI_CONFIG_FILE="$cache/terraformrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1

cd "$demo"
config=$(cat <<'TF'
terraform {
  required_providers {
    local   = { source = "hashicorp/local", version = "1.4.1-0.20260513075820-3561e410f9fe" }
    testsdk = { source = "kilolock/testsdk", version = "0.1.0" }
  }
}
# The project's test provider: each server is a JSON file under servers/, read back on every refresh.
provider "testsdk" {
  dir = "${path.module}/servers"
}
resource "testsdk_thing" "server" {
  for_each = toset(["web-1", "web-2"])
  key      = each.key
  name     = "nginx"
  labels   = ["frontend"]
  tags     = { env = "prod", size = "small" }
}
resource "local_file" "config" {
  for_each = toset(["a", "b", "c", "d", "e"])
  filename = "${path.module}/out/${each.key}.conf"
  content  = "setting = ${each.key}\n"
}
TF
)
# A workspace an earlier demo made with another configuration starts over, its kl state too.
if [ -f main.tf ] && [ "$(cat main.tf)" != "$config" ]; then
    echo "demo: starting over in $demo (made by an earlier version of the demo)"
    kl state rm demo --force >/dev/null 2>&1 || true
    rm -rf .terraform .terraform.lock.hcl terraform.tfstate terraform.tfstate.backup out servers
fi
if [ ! -f terraform.tfstate ]; then
    printf '%s\n' "$config" > main.tf
    echo "demo: terraform apply (Terraform 1.0.3, offline provider mirror) in $demo"
    mkdir -p servers
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
# kl runs the provider with the configuration stored for it (Terraform's provider block is not read).
echo "{\"dir\": \"$demo/servers\"}" | kl provider configure kilolock/testsdk --state demo --config - >/dev/null
if grep -q '"small"' servers/web-1.json 2>/dev/null; then
    echo "demo: resizing server web-1 (servers/web-1.json: tags.size small -> large) behind Terraform's back"
    sed -i 's/"small"/"large"/' servers/web-1.json
fi
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
