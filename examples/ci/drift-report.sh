#!/bin/sh
# Refresh one state without recording anything and report its drift as Markdown, for a CI job.
#
#   drift-report.sh STATE [kl refresh options...]     e.g. --workdir infra/prod --provider-search-path DIR
#
# Exit code, as `kl refresh --detailed-exitcode`: 0 no drift, 2 drift, 1 an error (kl could not
# refresh: the report then says why). Writes the report to $KL_REPORT (default kl-drift.md) and,
# under GitHub Actions, appends it to the job's step summary ($GITHUB_STEP_SUMMARY).
#
#   KL                 how to run kl (default: python3 kl.pyz); word-split, so no spaces in paths
#   KL_DATABASE_URL    the store (kl's own variable)
#   KL_REPORT          where the Markdown goes (default kl-drift.md)
set -u

if [ $# -lt 1 ]; then
    echo "usage: drift-report.sh STATE [kl refresh options...]" >&2
    exit 1
fi
state=$1
shift
report=${KL_REPORT:-kl-drift.md}
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT

# shellcheck disable=SC2086 # $KL is a command and its arguments
${KL:-python3 kl.pyz} refresh "$state" --dry-run --detailed-exitcode --format markdown "$@" >"$report" 2>"$errors"
code=$?
cat "$errors" >&2

# kl writes a report whenever it exits 0 or 2; a 2 without one came from something else, such as
# python3 that could not open kl.pyz, and must not pass for drift.
if [ "$code" -eq 2 ] && [ ! -s "$report" ]; then
    outcome=failed
else
    outcome=$code
fi
case $outcome in
    0 | 2) ;;
    *)
        # kl says what went wrong in one line on stderr; the report carries it to the summary or the note.
        {
            [ -s "$report" ] && echo
            printf '### Drift check of `%s` failed (exit %s)\n\n```\n' "$state" "$code"
            cat "$errors"
            printf '```\n'
        } >>"$report"
        code=1
        ;;
esac

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$report" >>"$GITHUB_STEP_SUMMARY"
fi
exit "$code"
