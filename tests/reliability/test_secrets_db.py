"""The database password in KL_DATABASE_URL, in every form libpq takes, is never printed: not by
`kl db status`, not in a connection error, not when the string is malformed, not in debug logs."""
from __future__ import annotations

import uuid

import pytest

from kit.leaks import LOUD

SECRET = f"dbpw-{uuid.uuid4().hex[:12]}"
UNREACHABLE = [
    f"host=/nonexistent user=x password={SECRET} dbname=y",
    f"host=/nonexistent user=x password = '{SECRET} with space' dbname=y",
    f"postgresql://x:{SECRET}@/y?host=/nonexistent",
    f"postgresql:///y?host=/nonexistent&password={SECRET}&user=x",
    f"postgresql://x@127.0.0.1:1/y?password={SECRET}",
    f"host=/nonexistent password=half {SECRET}",  # malformed: libpq quotes the fragment it stumbled on
    f"postgresql://x:{SECRET}@[unclosed/y",  # malformed URL
]


@pytest.mark.parametrize("url", UNREACHABLE, ids=range(len(UNREACHABLE)))
def test_connection_errors_mask_the_password(run_kl, url):
    for cmd in (("db", "status"), ("state", "list"), ("refresh", "prod")):
        r = run_kl(*cmd, env={**LOUD, "KL_DATABASE_URL": url})
        err = r.stderr.decode()
        assert r.returncode == 1 and err.startswith("kl: ") and "internal error" not in err, err
        assert SECRET not in err and SECRET not in r.stdout.decode(), err


def test_db_status_shows_where_without_the_password(run_kl, db_url):
    # The test cluster does not ask for a password, so this one connects and is shown.
    url = f"{db_url} password={SECRET}"
    r = run_kl("db", "status", env={**LOUD, "KL_DATABASE_URL": url})
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 0 and "password=***" in out and SECRET not in out, out
