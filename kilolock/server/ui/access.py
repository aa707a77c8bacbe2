"""Who may see which state in the web UI: every page and every list asks here, and nowhere else.

The answer is the server's grants (kilolock.server.access): a principal sees the states it may
read, as the API and the backend allow. The overview, search, and each state's pages filter or
refuse through ``visible`` (a state one may not see answers as if it did not exist)."""
from __future__ import annotations

from collections.abc import Iterable

from kilolock.server.access import Grants


def visible(grants: Grants, state_name: str) -> bool:
    """Whether the holder of GRANTS may see state STATE_NAME, its versions, drift and resources."""
    return grants.may_read(state_name)


def visible_names(grants: Grants, names: Iterable[str]) -> list[str]:
    """The states among NAMES that the holder of GRANTS may see, in the order given."""
    return [n for n in names if visible(grants, n)]


def visible_regexes(grants: Grants) -> list[str] | None:
    """Anchored PostgreSQL regexes of the states the holder of GRANTS may see, for a list that
    filters in SQL; None when it may see every state."""
    return grants.sql_regexes("read")
