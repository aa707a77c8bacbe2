"""PostgreSQL failover: a multi-host URL (`host=a,b` with target_session_attrs=read-write), the
primary killed with SIGKILL and its synchronous standby promoted (kit.replication), on loopback
addresses, with real servers and real kl processes."""
from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kit.replication import Replicated, replicated


@pytest.fixture
def pair() -> Iterator[Replicated]:
    with replicated("kl-fo-", databases=("kl",)) as p:
        yield p


def test_a_reconnect_after_a_failover_reaches_the_promoted_standby(pair):
    """libpq's account of a connection names the one host it reached: a reconnect made from it
    would go back to the dead primary. kl reconnects with the URL it was given, every host of it."""
    from kilolock.store import db

    conn = db.connect(pair.url("kl"))
    assert conn.info.port == pair.primary.port
    conn.execute("CREATE TABLE acknowledged (n int)")
    conn.execute("INSERT INTO acknowledged VALUES (1)")
    pair.kill_primary()
    pair.promote()
    with db.reconnect(conn) as fresh:
        assert fresh.info.port == pair.standby.port
        fresh.execute("INSERT INTO acknowledged VALUES (2)")
        # What the primary acknowledged is on the standby (synchronous): nothing lost, nothing twice.
        assert fresh.execute("SELECT n FROM acknowledged ORDER BY n").fetchall() == [(1,), (2,)]
    conn.close()


def test_recovery_waits_for_a_primary_while_the_standby_is_not_yet_promoted(pair, monkeypatch):
    """Between the primary's death and the promotion no server accepts writes: the recovery after
    a lost connection (settling a cut commit, finishing an audit row) tries again with backoff for
    KL_DATABASE_RECONNECT_WAIT, rather than leaving an outcome unknown that is known a moment later."""
    from kilolock.store import db

    conn = db.connect(pair.url("kl"))
    pair.kill_primary()
    with pytest.raises(db.DatabaseError, match="session is read-only"):
        db.reconnect(conn)  # no wait: one attempt, the standby refuses to be a read-write session
    monkeypatch.setenv(db.RECONNECT_WAIT_ENV, "60s")
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(_settle(conn)), daemon=True)
    waiting.start()
    pair.promote()
    waiting.join(90)
    assert got == [pair.standby.port]
    conn.close()


def _settle(conn: object) -> object:
    from kilolock.store import db

    try:
        with db.reconnected(conn) as fresh:  # type: ignore[arg-type]
            fresh.execute("SELECT 1")
            return fresh.info.port
    except Exception as exc:  # noqa: BLE001 - handed to the test thread
        return exc


def test_a_bad_reconnect_wait_is_one_line(monkeypatch):
    from kilolock.store import db

    monkeypatch.setenv(db.RECONNECT_WAIT_ENV, "soon")
    with pytest.raises(db.DatabaseError, match=r"^\$KL_DATABASE_RECONNECT_WAIT: invalid duration 'soon'"):
        db.reconnect_wait()


@pytest.mark.parametrize("url", [
    "postgresql://kl:s3cret@10.0.0.1:5432,10.0.0.2:5432/kl?target_session_attrs=read-write",
    "host=10.0.0.1,10.0.0.2 port=5432,5432 user=kl password=s3cret dbname=kl target_session_attrs=read-write",
    "postgresql://kl@10.0.0.1,10.0.0.2/kl?password=s3cret&target_session_attrs=read-write",
])
def test_a_multi_host_url_is_said_without_its_password_and_every_host_kept(url):
    from kilolock.store.db import Target

    said = Target(url=url, embedded=False).describe()
    assert "s3cret" not in said and "10.0.0.1" in said and "10.0.0.2" in said, said
