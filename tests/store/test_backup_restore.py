"""The backup docs/operations/database.md describes: `pg_dump --format=custom` of kl's database and
`pg_restore --no-owner` into an empty one give back everything kl knows, with nothing else to
copy: every version pulls back byte for byte, the schema is current, tokens and schedules are
there, and the restored database takes new writes."""
from __future__ import annotations

import subprocess
from pathlib import Path

from kit import pg
from kit.kl import run_kl
from kit.paths import REPO

STATES = REPO / "tests" / "fixtures" / "states"


def _kl(url: str, *args: str) -> str:
    r = run_kl(*args, env={"KL_DATABASE_URL": url})
    assert r.returncode == 0, (args, r.stderr.decode())
    return r.stdout.decode()


def test_pg_dump_and_pg_restore_carry_everything_kl_knows(db_url: str, pg_server: str, tmp_path: Path) -> None:
    from kilolock.store.embedded import find_pg_bin

    _kl(db_url, "state", "import", "app/prod", str(STATES / "varied.tfstate"))
    _kl(db_url, "state", "import", "app/prod", str(STATES / "varied-v2.tfstate"))
    _kl(db_url, "state", "set", "app/prod", "--workdir", str(tmp_path), "--provider-parallelism", "4")
    _kl(db_url, "token", "create", "ci", "--role", "write", "--states", "app/**")
    _kl(db_url, "schedule", "set", "--states", "app/**", "--every", "6h")

    dump = tmp_path / "kl.dump"
    bin_dir = find_pg_bin()
    subprocess.run([str(bin_dir / "pg_dump"), "--format=custom", f"--file={dump}", db_url], check=True, timeout=120)
    with pg.fresh_database(pg_server, "template0", prefix="kl_restore_") as restored:
        subprocess.run([str(bin_dir / "pg_restore"), f"--dbname={restored}", "--no-owner", str(dump)],
                       check=True, timeout=120)

        assert "schema    current" in _kl(restored, "db", "status")
        for serial in ("26", "30"):  # varied.tfstate's and varied-v2.tfstate's: each comes back as written
            assert _kl(restored, "state", "pull", "app/prod", "--serial", serial) == \
                _kl(db_url, "state", "pull", "app/prod", "--serial", serial)
        assert _kl(restored, "state", "versions", "app/prod") == _kl(db_url, "state", "versions", "app/prod")
        assert _kl(restored, "state", "show", "app/prod") == _kl(db_url, "state", "show", "app/prod")
        assert "ci" in _kl(restored, "token", "list")
        assert "app/**" in _kl(restored, "schedule", "list")
        _kl(restored, "state", "import", "app/dev", str(STATES / "varied.tfstate"))
        assert "app/dev" in _kl(restored, "state", "list")
