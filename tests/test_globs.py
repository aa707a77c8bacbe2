"""State-name globs (kilolock.globs): * within a segment, ** across, the same in Python and SQL."""
from __future__ import annotations

import psycopg
import pytest

from kilolock import globs
from kilolock.errors import UsageError

NAMES = ["prod", "team/dev", "team/dev/eu", "team/prod", "teams/x", "a.b", "axb", "team"]


@pytest.mark.parametrize(("glob", "expected"), [
    ("*", ["prod", "a.b", "axb", "team"]),
    ("team/*", ["team/dev", "team/prod"]),
    ("team/**", ["team/dev", "team/dev/eu", "team/prod"]),
    ("**", NAMES),
    ("team/**/eu", ["team/dev/eu"]),
    ("**/prod", ["prod", "team/prod"]),
    ("a.b", ["a.b"]),  # a dot is a dot, not any character
    ("team/?ev", ["team/dev"]),
    ("team*", ["team"]),  # * never crosses a /
    ("prod", ["prod"]),
])
def test_star_stays_in_a_segment_and_double_star_crosses(glob, expected):
    assert globs.select(glob, NAMES) == [n for n in NAMES if n in expected]


def test_the_sql_form_selects_what_python_selects(db_url):
    patterns = ["*", "team/*", "team/**", "**", "team/**/eu", "**/prod", "a.b", "team/?ev", "(x)|y", "a+b", "[ab]"]
    names = NAMES + ["(x)|y", "a+b", "[ab]", "é/ü"]
    with psycopg.connect(db_url) as conn:
        for glob in patterns:
            rows = conn.execute("SELECT n FROM unnest(%s::text[]) n WHERE n ~ %s", (names, globs.sql_regex(glob))).fetchall()
            assert sorted(r[0] for r in rows) == sorted(globs.select(glob, names)), glob


def test_an_empty_glob_is_a_usage_error():
    with pytest.raises(UsageError):
        globs.compile_glob("")
