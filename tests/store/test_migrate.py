"""`kl db migrate`: order, idempotence, checksums, one transaction per file."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import psycopg
import pytest

from kilolock.store import migrate
from kit.paths import REPO
from kit.pg import one_row


def test_applies_all_in_order_then_is_idempotent(empty_db_url):
    bundled = [m.name for m in migrate.bundled_migrations()]
    assert bundled == sorted(bundled) and bundled[0].startswith("0001_") and len(bundled) >= 6
    with psycopg.connect(empty_db_url) as conn:
        assert migrate.apply_migrations(conn) == bundled
        assert migrate.apply_migrations(conn) == []
        assert migrate.pending_migrations(conn) == []
        rows = conn.execute("SELECT name, checksum FROM schema_migrations ORDER BY name").fetchall()
    assert [r[0] for r in rows] == bundled
    assert all(len(r[1]) == 64 for r in rows)


def test_expected_tables_and_view_exist(conn):
    names = {r[0] for r in conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'").fetchall()}
    assert {"states", "state_locks", "state_versions", "resources", "provider_schemas", "provider_configs",
            "refresh_runs", "current_resource_drift", "schema_migrations", "version_pieces", "version_lists",
            "access_tokens", "access_grants", "access_audit", "provider_limits"} <= names
    idx = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'resources_closed_at_idx'").fetchone()
    assert idx and "WHERE (delete_serial IS NOT NULL)" in idx[0]
    cols = [r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'refresh_runs' ORDER BY ordinal_position")]
    assert cols == ["id", "state_id", "from_version_id", "to_version_id", "started_at", "finished_at",
                    "resources_checked", "resources_changed", "resources_failed", "status", "error_summary",
                    "actor", "created_at", "concurrency", "heartbeat_at"]


def test_stored_parallelism_is_auto_or_a_whole_number(conn):
    # 0011: the column became text so that it can say `auto`; it takes nothing else.
    sid = conn.execute("INSERT INTO states (name) VALUES ('p') RETURNING id").fetchone()[0]
    for good in ("auto", "1", "64", None):
        conn.execute("INSERT INTO state_settings (state_id, provider_parallelism) VALUES (%s, %s) "
                     "ON CONFLICT (state_id) DO UPDATE SET provider_parallelism = EXCLUDED.provider_parallelism", (sid, good))
    for bad in ("0", "-3", "x", "", "AUTO", "12345678901"):
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
            conn.execute("UPDATE state_settings SET provider_parallelism = %s WHERE state_id = %s", (bad, sid))


def test_refuses_when_an_applied_file_changed(empty_db_url, monkeypatch):
    with psycopg.connect(empty_db_url) as conn:
        migrate.apply_migrations(conn)
        original = migrate.bundled_migrations()
        changed = [migrate.Migration(m.name, m.sql + "\n-- edited\n") if m.name.startswith("0002") else m for m in original]
        monkeypatch.setattr(migrate, "bundled_migrations", lambda: changed)
        with pytest.raises(migrate.MigrationError, match=r"migration 0002_\S+ was changed after it was applied"):
            migrate.apply_migrations(conn)
        with pytest.raises(migrate.MigrationError):
            migrate.pending_migrations(conn)


def test_refuses_a_database_migrated_by_a_newer_kl(empty_db_url, monkeypatch):
    with psycopg.connect(empty_db_url) as conn:
        migrate.apply_migrations(conn)
        conn.execute("INSERT INTO schema_migrations (name, checksum) VALUES ('9999_future.sql', 'x')")
        conn.commit()
        with pytest.raises(migrate.MigrationError, match="newer kl"):
            migrate.apply_migrations(conn)


def test_a_failing_migration_leaves_nothing_behind(empty_db_url, monkeypatch):
    original = migrate.bundled_migrations()
    broken = original[:1] + [migrate.Migration("0002_broken.sql", "CREATE TABLE half_done (x int);\nSELECT no_such_function();")]
    monkeypatch.setattr(migrate, "bundled_migrations", lambda: broken)
    with psycopg.connect(empty_db_url) as conn:
        with pytest.raises(migrate.MigrationError, match="migration 0002_broken.sql failed"):
            migrate.apply_migrations(conn)
        assert one_row(conn, "SELECT to_regclass('half_done')")[0] is None
        assert [r[0] for r in conn.execute("SELECT name FROM schema_migrations")] == [original[0].name]


def test_from_a_zip_the_migrations_are_read_through_its_importer_alike(tmp_path):
    # kl.pyz reads them through the zipimporter's table of contents (importlib.resources would
    # open the whole zip again with zipfile): the same names, in order, with the same checksums.
    archive = tmp_path / "kl.zip"
    package = REPO / "kilolock"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(package.rglob("*")):
            if path.suffix in (".py", ".sql") and "__pycache__" not in path.parts:
                z.write(path, path.relative_to(REPO).as_posix())
        for path in sorted((REPO / "migrations").glob("*.sql")):  # kilolock/_migrations is a symlink to it
            z.write(path, f"kilolock/_migrations/{path.name}")
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import kilolock.store.migrate as m; "
             "import kilolock; assert kilolock.__file__.startswith(sys.argv[1]); "
             "print(json.dumps([[x.name, x.checksum] for x in m._zipped_migrations()]))")
    r = subprocess.run([sys.executable, "-I", "-c", probe, str(archive)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [[x.name, x.checksum] for x in migrate.bundled_migrations()]
