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


@pytest.mark.parametrize("glob", ["null_resource.*", "module.m.**", "**.null_resource.a", "local_*.*", "x", "**",
                                  'module.a["x"].null_resource.b[0]', "a[*]", 'a["web-*"]', 'a["x]y.z"]', 'a["q\\"s"]',
                                  "data.aws_ami.this", "a[1?]", "module.m[0].x.y"])
def test_address_globs_written_as_terraform_writes_addresses_are_valid(glob):
    assert globs.check_address_glob(glob) == glob


@pytest.mark.parametrize(("glob", "message"), [
    ("local_file.config[b]", ("""the instance key b at position 18 is not a number, so it is written quoted, as Terraform """
                             """prints it: 'local_file.config["b"]'""")),
    ('a[b].c[0].d["e"].f[g]', ("""the instance key b at position 2 is not a number, so it is written quoted, as Terraform """
                              """prints it: 'a["b"].c[0].d["e"].f["g"]'""")),
    ("a[]", 'expected an instance key [0] or ["key"] at position 2'),
    ("a[0", 'expected an instance key [0] or ["key"] at position 2'),
    ('a["x', "the instance key at position 2 is not closed"),
    (".a", "expected a name at position 1"),
    ("a.[0]", "expected a name at position 3"),
    ("a/b", "expected a name, . or [KEY] at position 2, found '/'"),
    ("a.", 'ends with "."'),
    ("", "must not be empty"),
])
def test_address_globs_no_address_could_match_are_refused_saying_where(glob, message):
    with pytest.raises(UsageError) as exc:
        globs.check_address_glob(glob)
    assert message in str(exc.value)


def test_claim_globs_separate_parts_with_colons_and_let_star_cross_slashes():
    from kilolock.globs import compile_claim_glob

    def m(glob: str, sub: str) -> bool:
        return compile_claim_glob(glob).fullmatch(sub) is not None

    main = "repo:acme/infra:ref:refs/heads/main"
    assert m("repo:acme/*:ref:refs/heads/main", main) and m("repo:acme/infra:**", main) and m("**", main)
    assert m("repo:acme/infra:ref:refs/heads/*", "repo:acme/infra:ref:refs/heads/feature/x")  # / is no separator
    assert not m("repo:acme/*:ref:refs/heads/main", "repo:acme/x:evil:ref:refs/heads/main")  # * stays within a part
    assert not m("repo:acme/*", main) and m("repo:**:ref:refs/heads/main", main)
    assert m("repo:acme/infr?:**", main) and not m("repo:acme/infra?:**", main)
