"""The delivery lease (store.deliveries.claim): two senders never hold the same delivery, a lease that
ran out (its process died mid-send) is claimed again, and only the lease holder records an attempt.
In-process, over the store functions kl's own processes use."""
from __future__ import annotations

import psycopg

from kilolock import globs, tfstate
from kilolock.store import deliveries, notify, writes


def _write(conn: psycopg.Connection, raw: bytes, source: str) -> None:
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source=source, actor="test")


def _pending_drift(conn: psycopg.Connection, make_state, channels: int) -> None:
    for n in range(channels):
        notify.add_channel(conn, name=f"c{n}", format="json", webhook="http://127.0.0.1:9/none", secret=None,
                           states_glob="**", states_regex=globs.sql_regex("**"), events=list(notify.EVENTS),
                           failed_after=1, ui_url=None, created_by="test")
    _write(conn, make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}), "apply")
    _write(conn, make_state(2, {"a": {"id": "1", "x": "drift"}, "b": {"id": "2"}}), "refresh")


def test_two_senders_never_hold_the_same_delivery(conn, db_url, make_state):
    _pending_drift(conn, make_state, channels=4)
    with psycopg.connect(db_url, autocommit=True) as other:
        mine = deliveries.claim(conn, "me", lease_s=60, limit=2)
        theirs = deliveries.claim(other, "them", lease_s=60, limit=10)
        assert len(mine) == 2 and len(theirs) == 2
        assert not {d["delivery_id"] for d in mine} & {d["delivery_id"] for d in theirs}
        assert deliveries.claim(other, "them", lease_s=60, limit=10) == []  # all four leased
        assert not deliveries.check_due(other)

        # Only the holder records an attempt; the other's write changes nothing.
        d = mine[0]["delivery_id"]
        assert deliveries.finish_attempt(other, d, "them", ok=True, http_status=200, error=None, duration_ms=1,
                                     retry_for_s=3600, max_delay_s=300) is None
        assert deliveries.finish_attempt(conn, d, "me", ok=False, http_status=500, error="HTTP 500", duration_ms=1,
                                     retry_for_s=3600, max_delay_s=300) == "pending"
        assert 0.0 < (deliveries.seconds_to_next(conn) or 0.0) <= 1.0  # its retry, one second on


def test_a_lapsed_lease_is_claimed_again_with_the_same_event(conn, db_url, make_state):
    _pending_drift(conn, make_state, channels=1)
    [first] = deliveries.claim(conn, "dead-process", lease_s=0.001, limit=10)
    conn.execute("SELECT pg_sleep(0.01)")
    with psycopg.connect(db_url, autocommit=True) as other:
        [again] = deliveries.claim(other, "next-process", lease_s=60, limit=10)
    assert (again["delivery_id"], again["event_id"]) == (first["delivery_id"], first["event_id"])
    # The dead process's late answer is not recorded over the new holder's lease.
    assert deliveries.finish_attempt(conn, first["delivery_id"], "dead-process", ok=True, http_status=200, error=None,
                                 duration_ms=1, retry_for_s=3600, max_delay_s=300) is None


def test_a_delivery_retried_past_its_window_is_failed_for_good(conn, make_state):
    _pending_drift(conn, make_state, channels=1)
    [d] = deliveries.claim(conn, "me", lease_s=60, limit=10)
    assert deliveries.finish_attempt(conn, d["delivery_id"], "me", ok=False, http_status=None, error="timed out",
                                 duration_ms=1, retry_for_s=0.5, max_delay_s=300) == "failed"
    assert not deliveries.check_due(conn)
    [row] = deliveries.delivery_log(conn, failed=True, channel=None, limit=10)
    assert (row["status"], row["attempts"], row["last_error"]) == ("failed", 1, "timed out")
