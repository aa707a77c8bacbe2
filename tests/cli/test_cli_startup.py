"""What every kl command pays before it runs: parsing its arguments (a small refresh feels each
millisecond here; benches/test_refresh_fixed_costs.py measures it)."""
from __future__ import annotations

import gettext

import pytest

from kilolock.cli import build_parser


def test_argparse_looks_each_message_up_in_the_catalogues_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # gettext stats every candidate catalogue on each call: building every command's parser asked
    # ~150 times per run (10-16 ms of a 10-instance refresh), to find no catalogue each time.
    searches = []
    real_find = gettext.find

    def counting_find(*args, **kwargs):  # type: ignore[no-untyped-def]
        searches.append(args[0])
        return real_find(*args, **kwargs)

    monkeypatch.setattr(gettext, "find", counting_find)
    build_parser().parse_known_args(["refresh", "prod", "-q"])
    build_parser().parse_known_args(["state", "list"])
    assert len(searches) < 10, f"{len(searches)} catalogue searches"
