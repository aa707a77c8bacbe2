#!/usr/bin/env bash
# Everything the tests and the demo need, installed idempotently on a fresh machine:
#   - PostgreSQL server binaries (Debian package, when missing and we are root)
#   - with the test extra: zsh and fish for the completion tests, Debian's chromium and
#     chromium-driver for the web UI's browser tests, PgBouncer for the fleet suite (Debian
#     packages, when missing and we are root)
#   - a virtualenv at .venv with kilolock installed editable (builds the Rust codec via maturin)
#   - the real provider binaries and our test provider (tests/testprovider), Terraform 1.0.3, 1.8.5,
#     1.12.2 and 1.13.3, OpenTofu 1.6.3, 1.8.5 and 1.12.6 (test-providers.sh, test-terraform.sh)
# What it installs can be narrowed (the defaults are what the tests and CI need):
#   KL_SETUP_EXTRAS      pip extras of kilolock, comma-separated (default test,bench,lint,docs; empty: none)
#   KL_SETUP_PROVIDERS   providers for test-providers.sh, space-separated (default all)
#   KL_SETUP_TERRAFORMS  CLIs for test-terraform.sh, space-separated (default all)
#   KL_SETUP_CLIS=background  with all CLIs: those needing a Go build build in the background
#                        (scripts/test.sh sets it; see the end of this file)
#   KL_SETUP_LOG=FILE    what apt-get, pip, maturin and go print goes to FILE (appended), not the
#                        terminal; a failure prints the file's last lines and its path; a run that
#                        succeeds ends the file with one summary line per step
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${KL_SETUP_EXTRAS-test,bench,lint,docs}"
setup_log="${KL_SETUP_LOG:-}"

log() { echo "setup: $*" >&2; }
# One line per step for the end of the log, so it ends with what happened rather than a build's noise.
summary=()
step_started=$SECONDS
done_step() { summary+=("setup: $1: $2 ($((SECONDS - step_started)) s)"); step_started=$SECONDS; }
# Runs a noisy command with its output in $KL_SETUP_LOG when that is set.
quiet() { if [ -n "$setup_log" ]; then "$@" >>"$setup_log" 2>&1; else "$@"; fi; }
if [ -n "$setup_log" ]; then
    mkdir -p "$(dirname "$setup_log")"
    export KL_SETUP_LOG="$setup_log"  # test-providers.sh and test-terraform.sh log there too
    on_exit() {
        local rc=$?
        if [ "$rc" -eq 0 ]; then
            printf '%s\n' "${summary[@]}" "setup: ready" >>"$setup_log"
            return 0
        fi
        [ -s "$setup_log" ] || return 0
        log "failed; the last lines of $setup_log:"
        tail -n 15 "$setup_log" | sed "s/^/  | /" >&2
        log "full output: $setup_log"
    }
    trap on_exit EXIT
fi

have_pg() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }
pg_status=present
if ! have_pg; then
    pg_status="installed (apt-get install postgresql)"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing PostgreSQL server binaries (apt-get install postgresql)"
        quiet apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq postgresql >/dev/null
    else
        echo "setup: PostgreSQL server binaries are missing: install them (Debian: apt-get install postgresql)" >&2
        exit 1
    fi
fi
done_step "PostgreSQL server binaries" "$pg_status"

# The system packages only the tests use, installed with the test extra: the demo (no extras)
# must not pull a browser or a pooler onto a newcomer's machine, nor warn that they are missing.
case ",$extras," in
    *,test,*) test_packages=1 ;;
    *) test_packages="" ;;
esac
if [ -z "$test_packages" ]; then
    for step in "chromium, chromium-driver" pgbouncer "zsh, fish"; do done_step "$step" "not needed (no test extra)"; done
else
    # The web UI's browser tests drive Debian's chromium through Debian's chromedriver (a browser build
    # cannot be downloaded here); without root, the tests that need them say what to install.
    browser_status=present
    if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
        browser_status=missing
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            browser_status="installed (apt-get)"
            log "installing chromium and chromium-driver for the browser tests (apt-get install chromium chromium-driver)"
            quiet apt-get update -qq >/dev/null
            DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
        else
            log "chromium or chromium-driver is missing: the web UI's browser tests will fail until they are installed (Debian: apt-get install chromium chromium-driver)"
        fi
    fi
    # PgBouncer (Debian's, 1.18) for the fleet suite through a transaction pooler (tests/fleet/test_fleet_pgbouncer.py).
    have_pgbouncer() { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }
    if ! have_pgbouncer && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing PgBouncer (apt-get install pgbouncer)"
        quiet apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq pgbouncer >/dev/null
    fi
    have_pgbouncer || echo "setup: pgbouncer is missing: its tests will fail until it is installed (Debian: apt-get install pgbouncer)" >&2
    done_step "chromium, chromium-driver" "$browser_status"
    if have_pgbouncer; then done_step pgbouncer present; else done_step pgbouncer missing; fi
    # zsh and fish for the completion tests (tests/cli/test_completion.py), which load kl's scripts into them.
    shells_status=present
    for shell in zsh fish; do
        if ! command -v "$shell" >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            log "installing $shell for the completion tests (apt-get install $shell)"
            quiet apt-get update -qq >/dev/null
            DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq --no-install-recommends "$shell" >/dev/null
            shells_status=installed
        fi
        if ! command -v "$shell" >/dev/null; then
            echo "setup: $shell is missing: the completion tests will fail until it is installed (Debian: apt-get install $shell)" >&2
            shells_status=missing
        fi
    done
    done_step "zsh, fish" "$shells_status"
fi

for tool in cargo go python3; do
    command -v "$tool" >/dev/null || { echo "setup: '$tool' is required (Rust via rustup, Go >= 1.26.6, Python >= 3.10)" >&2; exit 1; }
done

if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    quiet python3 -m venv .venv
fi
# The stamp holds the hash of what the build reads and the extras installed ("-" for none): an
# install is redone when the sources changed or an extra is wanted that is not there yet.
stamp=.venv/.kl-installed
want=$(cat pyproject.toml .cargo/config.toml codec_rs/Cargo.toml codec_rs/src/*.rs 2>/dev/null | sha256sum | cut -c1-16)
have_hash="" have_extras=""
[ -f "$stamp" ] && read -r have_hash have_extras < "$stamp" || true
[ -n "$have_hash" ] && [ -z "$have_extras" ] && have_extras=test,bench,lint  # a stamp from before extras were recorded
install=0
[ "$have_hash" = "$want" ] || install=1
for extra in ${extras//,/ }; do
    case ",$have_extras," in *",$extra,"*) ;; *) install=1 ;; esac
done
# The extension's former name: a copy left under it would sit unused beside kilolock/_native.
rm -f kilolock/_codec_rs.*so
if [ "$install" = 1 ]; then
    log "installing kilolock into .venv${extras:+ with its $extras extras}; this builds the Rust codec (a few minutes the first time)"
    quiet .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    quiet .venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
    echo "$want ${extras:--}" > "$stamp"
    done_step ".venv" "kilolock installed editable with the Rust codec${extras:+ and the $extras extras}"
else
    done_step ".venv" "up to date"
fi
# Byte-compile our sources: many CI environments set PYTHONDONTWRITEBYTECODE, which would make
# every kl start-up (and every start-up benchmark) recompile the package.
.venv/bin/python -m compileall -q kilolock >/dev/null

# shellcheck disable=SC2086 # space-separated lists on purpose
bash scripts/test-providers.sh ${KL_SETUP_PROVIDERS:-all} >/dev/null
done_step "providers" "${KL_SETUP_PROVIDERS:-all} ready"
# The tests drive Terraform 1.0.3 (PyPI, seconds), 1.8.5 and OpenTofu 1.6.3 (go install: ~15 min
# cold on 2 cores), Terraform 1.12.2 and OpenTofu 1.8.5 (go build of their module source: 29 and
# 18 min cold on 2 cores shared with other builds, load average 13-22), Terraform 1.13.3 and
# OpenTofu 1.12.6 (the same: 5 and 9 min after the others, 17 and 10 min alone and cold),
# each built once per cache; the demo needs only 1.0.3 (KL_SETUP_TERRAFORMS=terraform-1.0.3).
clis="${KL_SETUP_TERRAFORMS:-all}"
cli_bin="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}/bin"
missing=()
if [ "${KL_SETUP_CLIS:-}" = background ] && [ "$clis" = all ]; then
    for tool in terraform-1.8.5 terraform-1.12.2 terraform-1.13.3 tofu-1.6.3 tofu-1.8.5 tofu-1.12.6; do
        [ -x "$cli_bin/$tool" ] || missing+=("$tool")
    done
fi
if [ ${#missing[@]} -eq 0 ]; then
    # shellcheck disable=SC2086
    bash scripts/test-terraform.sh $clis >/dev/null
    # A background build's status from an earlier run says nothing about this one (test.sh reads it).
    [ -f "$cli_bin/background-build.pid" ] || rm -f "$cli_bin/background-build.status"
else
    # KL_SETUP_CLIS=background (scripts/test.sh): the compiled CLIs that are missing (a cold machine:
    # about 35 minutes of Go builds on two cores) build in the background at the lowest CPU priority,
    # on what the test run leaves idle; the tests that drive them run last and wait for them
    # (tests/kit/clis.py: the same file names), and test.sh waits before the benchmarks. The build
    # goes on if the run is interrupted: it only fills the cache.
    bash scripts/test-terraform.sh terraform-1.0.3 >/dev/null
    mkdir -p "$cli_bin"
fi
if [ ${#missing[@]} -eq 0 ]; then
    done_step "Terraform/OpenTofu CLIs" "$clis ready"
else
    done_step "Terraform/OpenTofu CLIs" "terraform-1.0.3 ready; ${missing[*]} building in the background"
fi
if [ ${#missing[@]} -gt 0 ] && [ -f "$cli_bin/background-build.pid" ] && kill -0 "$(cat "$cli_bin/background-build.pid")" 2>/dev/null; then
    log "${missing[*]}: already building in the background (log: $cli_bin/background-build.log)"
elif [ ${#missing[@]} -gt 0 ]; then
    rm -f "$cli_bin/background-build.status"
    log "building ${missing[*]} in the background (log: $cli_bin/background-build.log); the tests that drive them run last"
    (
        set +e
        KL_SETUP_LOG="" nice -n 19 bash scripts/test-terraform.sh "${missing[@]}" >"$cli_bin/background-build.log" 2>&1
        echo $? >"$cli_bin/background-build.status"
        rm -f "$cli_bin/background-build.pid"
    ) </dev/null >/dev/null 2>&1 &  # holds none of setup's output open: a caller reading it is not kept waiting
    echo $! >"$cli_bin/background-build.pid"
fi
log "ready"
