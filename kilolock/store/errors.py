"""What the store raises about states and their versions, apart from the code that raises it: the
web UI and the server catch these without importing a write path."""
from __future__ import annotations

from kilolock.errors import KlError


class StateNotFound(KlError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no state named {name!r} (see `kl state list`)")
        self.name = name

    def suggesting(self, close: str | None) -> str:
        """The message, naming CLOSE (states.closest_name) when there is one."""
        return f"no state named {self.name!r}; did you mean {close!r}? (see `kl state list`)" if close else str(self)


class VersionConflict(KlError):
    """A write that would overwrite or fork history (serial not advancing, foreign lineage, or a
    state that moved under a compare-and-swap)."""
