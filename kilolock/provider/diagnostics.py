"""Provider diagnostics as Kilolock's own objects, independent of the protocol version."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from kilolock.schema import AttributePath, path_display


class Severity(enum.IntEnum):
    """Numbers as on the wire (``Diagnostic.Severity``)."""

    INVALID = 0
    ERROR = 1
    WARNING = 2


@dataclass(frozen=True)
class Diagnostic:
    """A provider's diagnostic (warning or error), as the plugin protocol sends it."""

    severity: Severity
    summary: str
    detail: str = ""
    attribute: AttributePath = ()

    def describe(self) -> str:
        """One line: where (if known), summary and detail (providers' multi-line details folded)."""
        where = f"at {path_display(self.attribute)}: " if self.attribute else ""
        detail = f": {self.detail}" if self.detail and self.detail != self.summary else ""
        return " ".join(f"{where}{self.summary}{detail}".split())


def errors_of(diagnostics: tuple[Diagnostic, ...]) -> tuple[Diagnostic, ...]:
    # INVALID is treated as an error: a provider that sends it is broken, and hiding it is worse.
    return tuple(d for d in diagnostics if d.severity != Severity.WARNING)
