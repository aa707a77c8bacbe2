"""Upgrades keep data: a database as each released schema left it migrates without losing a byte.

Migrations 0001–0006 are released: they are never edited (their checksums are recorded in every
database they ran on); a schema change is a new file, 0007 and on. Each schema change also gets
a fixture: after adding migration NNNN, run ``PYTHONPATH=.:tests python -m kit.upgrade`` (see its
docstring), which fills a database at the new head schema with the code of that time and writes
fixtures/schema-NNNN.sql (its rows) and fixtures/schema-NNNN.json (its row counts, the sha256 of
every version's pull, its held locks). Commit both, and extend ``kit.upgrade.populate`` first when
the migration adds tables or columns, so they hold data. Old fixtures are never regenerated.

For every fixture this test builds the database as that release left it (its migrations only,
through the real runner, then its rows), runs ``kl db migrate`` with the current code, and checks
that no row was lost or added, every version pulls byte-identical (``kl state pull --serial`` and
the backend's GET, which Terraform uses) and held locks are still held by the same LockInfo.
"""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from kilolock import cli
from kilolock.store import summary
from kilolock.store.migrate import apply_migrations, pending_migrations
from kit import upgrade as upgradekit

CASES = sorted(upgradekit.FIXTURES.glob("schema-*.sql"))


def test_every_released_schema_has_a_fixture() -> None:
    # 0006 is the oldest schema anyone runs. A fixture is the head of a release (its last
    # migration); the migrations a release adds before its head are covered by the fixtures on
    # either side of them: the one before is migrated through them, the head is written by them.
    from kilolock.store.migrate import bundled_migrations

    heads = {p.stem.split("-", 1)[1] for p in CASES}
    newest = max(m.name[:4] for m in bundled_migrations())
    assert newest in heads, f"no upgrade fixture for the newest schema {newest}: run PYTHONPATH=.:tests python -m kit.upgrade"
    assert "0006" in heads


@pytest.mark.parametrize("fixture", CASES, ids=[p.stem for p in CASES])
def test_upgrade_keeps_every_row_and_every_byte(fixture: Path, empty_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = fixture.stem.split("-", 1)[1]
    expected = json.loads(fixture.with_suffix(".json").read_text(encoding="utf-8"))

    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        apply_migrations(conn, upgradekit.released_migrations(schema))
        upgradekit.load(conn, fixture.read_text(encoding="utf-8"))
        assert upgradekit.row_counts(conn, list(expected["counts"])) == expected["counts"], "the fixture did not load whole"

    # The user's command, in-process: the current code migrates what the old release left.
    assert cli.main(["db", "migrate"]) == 0
    capsys.readouterr()

    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert pending_migrations(conn) == []
        assert upgradekit.row_counts(conn, list(expected["counts"])) == expected["counts"]
        current = {s["name"]: s["serial"] for s in summary.list_states(conn)}
        for pull in expected["pulls"]:
            if pull["via"] == "GET":
                assert current[pull["state"]] == pull["serial"], f"{pull['state']}: the current version changed"
                body = upgradekit.backend_get(conn, pull["state"])
            else:
                body = upgradekit.cli_pull(pull["state"], pull["serial"])
            assert upgradekit.digest(body) == {"sha256": pull["sha256"], "bytes": pull["bytes"]}, (
                f"{pull['state']} v{pull['serial']} ({pull['via']}) no longer pulls byte-identical")
        assert upgradekit.held_locks(conn) == expected["locks"]
