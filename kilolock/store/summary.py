"""Read-only overviews of states for `kl state list` and `kl status`."""
from __future__ import annotations

from typing import Any

import psycopg

from kilolock.store.versions import state_id

_LIST = """
SELECT s.name, v.serial, (SELECT count(*) FROM state_versions x WHERE x.state_id = s.id) AS versions,
       (SELECT count(*) FROM resources r WHERE r.state_id = s.id AND r.delete_serial IS NULL) AS resources,
       v.created_at
FROM states s
LEFT JOIN LATERAL (
    SELECT serial, created_at FROM state_versions WHERE state_id = s.id ORDER BY serial DESC LIMIT 1
) v ON true
ORDER BY s.name
"""

_STATUS = """
SELECT v.serial, v.lineage, v.terraform_version,
       (SELECT count(*) FROM state_versions x WHERE x.state_id = %(sid)s),
       (SELECT count(*) FROM resources r WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.mode = 'managed'),
       (SELECT count(*) FROM resources r WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.mode = 'data'),
       (SELECT count(*) FROM current_resource_drift d WHERE d.state_id = %(sid)s),
       (SELECT who FROM state_locks l WHERE l.state_id = %(sid)s)
FROM (SELECT 1) one
LEFT JOIN LATERAL (
    SELECT serial, lineage, terraform_version FROM state_versions WHERE state_id = %(sid)s ORDER BY serial DESC LIMIT 1
) v ON true
"""

_LAST_REFRESH = """
SELECT f.serial, t.serial, rr.status, rr.started_at, rr.id
FROM refresh_runs rr
JOIN state_versions f ON f.id = rr.from_version_id
LEFT JOIN state_versions t ON t.id = rr.to_version_id
WHERE rr.state_id = %s
ORDER BY rr.started_at DESC LIMIT 1
"""


def list_states(conn: psycopg.Connection) -> list[dict[str, Any]]:
    return [
        {"name": r[0], "serial": r[1], "versions": r[2], "resources": r[3], "updated_at": r[4]}
        for r in conn.execute(_LIST).fetchall()
    ]


def state_status(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    sid = state_id(conn, name)
    serial, lineage, tfv, nversions, managed, data, drift, locked_by = conn.execute(_STATUS, {"sid": sid}).fetchone()
    last = conn.execute(_LAST_REFRESH, (sid,)).fetchone()
    return {
        "state": name,
        "serial": serial,
        "lineage": lineage,
        "terraform_version": tfv,
        "versions": nversions,
        "managed": managed,
        "data": data,
        "open_drift": drift,
        "locked_by": locked_by,
        "last_refresh": None
        if last is None
        else {"from_serial": last[0], "to_serial": last[1], "status": last[2], "started_at": last[3], "run_id": str(last[4])},
    }
