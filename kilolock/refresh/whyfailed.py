"""A failed run's reason in one line: how many resources failed, the first cause, and how to fix it
when kl knows (a missing provider binary). Every place that reports a run (kl refresh, the worker's
log, kl fleet status, kl runs) shows this one text, so the cause is never only in --format json."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kilolock.refresh.options import RefreshOptions
    from kilolock.refresh.result import Failure, Result

# Marks a run-level error that names its first cause (failed_resources wrote it).
FIRST = "(first: "
# The audit row keeps the first cause whole after this: the reports show what comes before it.
IN_FULL = "; the first cause in full: "
# What a report shows of an audit row's error: room for the first cause and its fix.
HEADLINE_MAX = 400
# A cause longer than this is cut: the line must stay readable in a table and a log.
CAUSE_MAX = 160
# A clause boundary this far in is a better cut than the middle of a word.
_MIN_CUT = 40


def shorten(text: str, limit: int = CAUSE_MAX) -> str:
    """TEXT's first line, at most LIMIT characters: cut at the last '; ' clause that fits (a
    discovery error's list of directories goes first), else at a word, marked with ' ...'."""
    lines = text.strip().splitlines() or [""]
    line = lines[0].rstrip()
    if len(line) <= limit:
        return line + (" ..." if len(lines) > 1 else "")
    head = line[:limit]
    cut = head.rfind("; ")
    if cut < _MIN_CUT:
        cut = head.rfind(" ")
    if cut < _MIN_CUT:
        cut = limit
    return head[:cut].rstrip(" ;,.") + " ..."


def _cause(first: Failure) -> tuple[str, str]:
    """(where, what) of the first failure: a provider group that could not start is named by its
    first instance, and its message without the repeated 'provider SOURCE: ' prefix."""
    if first.address is not None:
        return first.address, first.message
    where = first.addresses[0] if first.addresses else (first.provider or "?")
    prefix = f"provider {first.provider}: "
    what = first.message[len(prefix):] if first.provider and first.message.startswith(prefix) else first.message
    return where, what


# The calls whose error diagnostics reject the provider's configuration, in both protocols; the
# provider client words such an error "provider NAME: CALL: ...".
_CONFIG_CALLS = ("Configure", "ConfigureProvider", "PrepareProviderConfig", "ValidateProviderConfig")


def _config_fix(result: Result, first: Failure, what: str) -> str | None:
    """How to give a provider the configuration it refused: kl never reads Terraform's provider
    block, so a provider that needs settings there fails Configure until they are stored in kl."""
    if first.provider is None or not what.startswith("provider "):
        return None
    call = what.split(": ", 2)[1] if what.count(": ") >= 2 else ""
    if call not in _CONFIG_CALLS and "config does not fit its schema" not in what:
        return None
    # A group's label is SOURCE or SOURCE.ALIAS; a source's last segment (the type) has no dot.
    host, _, last = first.provider.rpartition("/")
    type_, _, alias = last.partition(".")
    source = f"{host}/{type_}".removeprefix("registry.terraform.io/")
    return (f"fix: `kl provider configure {source}{f' --alias {alias}' if alias else ''} --state {result.state} "
            "--config FILE` (kl gives a provider the config stored there, not Terraform's provider block)")


def _fix(result: Result, options: RefreshOptions, first: Failure, what: str) -> str | None:
    # Here, not at the top: kl runs imports headline, and the provider package imports its launcher.
    from kilolock.provider.errors import NO_BINARY

    if not what.startswith(NO_BINARY):
        return _config_fix(result, first, what)
    if options.workdir is None:
        # Discovery looks in the workdir's .terraform/providers: with none stored it looked in kl's own directory.
        return (f"fix: `kl state set {result.state} --workdir DIR` (the directory terraform init ran in) "
                "or --provider-search-path DIR")
    return (f"fix: run terraform init in {options.workdir}, or `kl state set {result.state} "
            "--provider-search-path DIR`")


def failed_resources(result: Result, options: RefreshOptions) -> str:
    """'4 resource(s) failed (first: local_file.a: no binary for provider ...); nothing committed',
    with the fix appended when the cause has a known one."""
    if not result.failures:
        return f"{result.failed} resource(s) failed; nothing committed"
    where, what = _cause(result.failures[0])
    fix = _fix(result, options, result.failures[0], what)
    return (f"{result.failed} resource(s) failed {FIRST}{where}: {shorten(what)}); nothing committed"
            + (f"; {fix}" if fix else ""))


def audit_summary(result: Result) -> str | None:
    """The audit row's error_summary: the run-level error and, where the error cut the first cause
    short (or does not name it, as a cancelled run's), that cause whole: nothing is lost from the
    audit trail."""
    summary = result.error
    if not result.failures:
        return summary
    first = result.failures[0]
    whole = first.message if first.address is None else f"{first.address}: {first.message}"
    if summary is not None and FIRST in summary:
        _, what = _cause(first)
        return summary if shorten(what) == what else f"{summary}{IN_FULL}{whole}"
    return f"{summary or f'{result.failed} resource(s) failed'}; first: {whole}"


def headline(summary: str) -> str:
    """An audit row's (or a fleet job's) error as reports show it: one line, without the whole cause."""
    return shorten(summary.split(IN_FULL, 1)[0], HEADLINE_MAX)
