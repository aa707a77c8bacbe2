"""Provider stderr (hclog JSON lines, or ``[LEVEL]``-prefixed text from old SDKs) → Python logging.

Values the refresh run knows to be secret (its kilolock.redact.Redactor) are masked in every line
it logs: providers echo tokens and attribute values in their logs and panics.

Each provider logs under ``kilolock.provider.<name>``. A log line is plugin chatter, not protocol
payload, so decoding it here does not break the rule that the wire layer never parses values.
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping

from kilolock.redact import Redactor

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

_LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_PREFIXES = tuple((f"[{name.upper()}]", level) for name, level in _LEVELS.items())
_RESERVED = {"@level", "@message", "@timestamp", "@module", "@caller"}


def provider_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"kilolock.provider.{name}")


class StderrLogBridge:
    """Feeds one provider's stderr lines into its logger; tracks Go panics as Terraform does."""

    def __init__(self, logger: logging.Logger, secrets: Redactor | None = None) -> None:
        self._logger = logger
        self._secrets = Redactor() if secrets is None else secrets  # None: no secrets to mask
        self._in_panic = False

    def line(self, raw: str) -> None:
        text = raw.rstrip("\r\n")
        if not text:
            return
        if text.startswith(("panic: ", "fatal error: ")):
            self._in_panic = True
        if self._in_panic:
            self._logger.error("%s", self._secrets.redact(text))
            return
        if not self._logger.isEnabledFor(TRACE) and not self._logger.isEnabledFor(logging.WARNING):
            return
        level, message = self._parse(text)
        if self._logger.isEnabledFor(level):
            # Redacted after parsing: hclog escapes values in JSON, the message shows them decoded.
            self._logger.log(level, "%s", self._secrets.redact(message))

    @staticmethod
    def _parse(text: str) -> tuple[int, str]:
        if text.startswith("{"):
            try:
                entry = json.loads(text)
            except ValueError:
                entry = None
            if isinstance(entry, dict):
                level = _LEVELS.get(str(entry.get("@level", "")).lower(), logging.DEBUG)
                extras = " ".join(f"{k}={entry[k]!r}" for k in entry if k not in _RESERVED)
                message = str(entry.get("@message", ""))
                module = entry.get("@module")
                if module:
                    message = f"{module}: {message}"
                return level, f"{message} {extras}".rstrip()
        for prefix, level in _PREFIXES:
            if prefix in text[:40]:
                return level, text
        return logging.DEBUG, text


def provider_log_level(env: Mapping[str, str]) -> int | None:
    """The level asked for by TF_LOG_PROVIDER, TF_LOG or KL_LOG (first set wins), or None.

    As in Terraform, a value that is not a level name (e.g. TF_LOG=1 or JSON) means TRACE.
    """
    for var in ("TF_LOG_PROVIDER", "TF_LOG", "KL_LOG"):
        value = env.get(var, "").strip().lower()
        if value and value != "off":
            return _LEVELS.get(value, TRACE)
    return None


def configure_provider_logging(env: Mapping[str, str]) -> int | None:
    """Make provider log lines visible on stderr when the environment asks for them.

    Called once by the CLI at start-up; returns the level set, or None when nothing was asked.
    """
    level = provider_log_level(env)
    if level is None:
        return None
    logger = logging.getLogger("kilolock.provider")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    return level


# terraform-plugin-log's level variables. Unset, a provider built on it logs at TRACE: tens of JSON
# lines per RPC, which Terraform reads and throws away unless TF_LOG is set. Producing and draining
# them more than doubled the cost of a ReadResource against the time provider (5.1 → 2.0 ms), so
# when nobody asked for provider logs kl asks providers for warnings and errors only.
_PLUGIN_LOG_VARS = (
    "TF_LOG_PROVIDER",
    "TF_LOG_SDK",
    "TF_LOG_SDK_PROTO",
    "TF_LOG_SDK_FRAMEWORK",
    "TF_LOG_SDK_HELPER_SCHEMA",
    "TF_LOG_SDK_HELPER_RESOURCE",
    "TF_LOG_SDK_MUX",
)


def quiet_plugin_log_env(env: Mapping[str, str]) -> dict[str, str]:
    """Extra plugin environment: WARN levels unless logs were asked for or levels are set already."""
    if provider_log_level(env) is not None:
        return {}
    return {var: "WARN" for var in _PLUGIN_LOG_VARS if var not in env}
