"""Who may see which state in the web UI: every page and every list asks here, and nowhere else.

Today every authenticated principal sees every state, as the API and the backend allow. Per-state
grants plug in by changing ``visible`` alone: the overview, search, and each state's pages filter
or refuse through it (a state one may not see answers as if it did not exist)."""
from __future__ import annotations

from collections.abc import Iterable

from kilolock.server.auth import Principal


def visible(principal: Principal, state_name: str) -> bool:
    """Whether PRINCIPAL may see state STATE_NAME, its versions, drift and resources."""
    return True


def visible_names(principal: Principal, names: Iterable[str]) -> list[str]:
    """The states among NAMES that PRINCIPAL may see, in the order given."""
    return [n for n in names if visible(principal, n)]
