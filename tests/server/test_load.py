"""50 concurrent clients doing GET / LOCK / POST / UNLOCK on 10 states for a few seconds (the 30 s
run is benches/test_serve_load.py): no lost or duplicated version, no hang, every lock answer right."""
from __future__ import annotations

import os

from kit.loadgen import check_database, run_load


def test_fifty_clients_ten_states(start_server, db_url):
    from kilolock.server.auth import Authenticator

    srv = start_server(auth=Authenticator(token="load-token"))
    seconds = float(os.environ.get("KL_SERVE_LOAD_SECONDS", "4"))
    out = run_load(srv.url, [f"load-{i}" for i in range(10)], clients=50, seconds=seconds, token="load-token")
    print(f"\nkl serve load: {out.requests} requests in {out.seconds:.1f}s = {out.requests_per_second:.0f} req/s; "
          f"{out.cycles} write cycles, {out.conflicts} lock conflicts (423)")
    assert out.errors == []
    assert out.cycles > 0 and out.conflicts > 0  # both paths exercised: contention is the point
    assert check_database(db_url, out) == []
