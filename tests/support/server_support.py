"""What the server tests share (tests/server/test_server_*.py): a recorded history, a way to write
more of it while a server follows the file, and small helpers for reading change streams.

`World` pairs an `Oplog` builder (tests/support/oplog_builders.py) with a running server: write
entries with `world.oplog`, then `world.flush()` appends the new ones to the served file.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.testing import RunningServer, write_oplog
from pipeline_stages import resume_token as rt
from tests.support.oplog_builders import Oplog, make_lsid

ORDERS = "shop.orders"
ITEMS = "shop.items"
DOOMED = "shop.doomed"
THINGS = "other.things"

# Events as (operationType, db, coll, documentKey._id) for the recorded history, per scope.
ORDERS_EVENTS = [
    ("insert", "shop", "orders", 1),
    ("insert", "shop", "orders", 2),
    ("insert", "shop", "orders", 3),
    ("insert", "shop", "orders", 4),
    ("update", "shop", "orders", 1),
    ("replace", "shop", "orders", 2),
    ("delete", "shop", "orders", 3),
    ("insert", "shop", "orders", 10),
]
SHOP_EVENTS = [
    *ORDERS_EVENTS[:7],
    ("insert", "shop", "items", 1),
    ("insert", "shop", "orders", 10),
    ("insert", "shop", "items", 10),
    ("insert", "shop", "doomed", 1),
    ("drop", "shop", "doomed", None),
    ("insert", "shop", "doomed", 2),
]
CLUSTER_EVENTS = [
    *SHOP_EVENTS[:8],
    ("insert", "other", "things", 1),
    *SHOP_EVENTS[8:],
]
DOOMED_EVENTS = [
    ("insert", "shop", "doomed", 1),
    ("drop", "shop", "doomed", None),
    ("invalidate", None, None, None),
]


def record_history(oplog: Oplog) -> Timestamp:
    """Write the recorded history; returns the timestamp of its first entry."""
    first = oplog.create(ORDERS)["ts"]
    for i in range(1, 5):
        oplog.insert(ORDERS, {"_id": i, "item": f"item-{i}", "qty": i * 2, "status": "new"})
    oplog.update(ORDERS, 1, {"u": {"status": "paid"}})
    oplog.replace(ORDERS, {"_id": 2, "item": "item-2", "qty": 5, "status": "replaced"})
    oplog.delete(ORDERS, 3)
    oplog.create(ITEMS)
    oplog.insert(ITEMS, {"_id": 1, "name": "spoon"})
    oplog.insert(THINGS, {"_id": 1, "x": 1.5})
    oplog.noop()
    txn = oplog.transaction(make_lsid(1), 1)
    txn.commit(
        [
            oplog.op_insert(ORDERS, {"_id": 10, "item": "txn", "qty": 1, "status": "new"}),
            oplog.op_insert(ITEMS, {"_id": 10, "name": "fork"}),
        ]
    )
    oplog.create(DOOMED)
    oplog.insert(DOOMED, {"_id": 1})
    oplog.drop(DOOMED, num_records=1)
    oplog.create(DOOMED)
    oplog.insert(DOOMED, {"_id": 2})
    return first


@dataclass
class World:
    oplog: Oplog
    path: pathlib.Path
    first_ts: Timestamp
    server: RunningServer | None = None
    _sent: int = field(default=0)

    @classmethod
    def record(cls, path: pathlib.Path) -> World:
        oplog = Oplog()
        first = record_history(oplog)
        write_oplog(path, oplog.entries)
        return cls(oplog, path, first, _sent=len(oplog.entries))

    def flush(self) -> int:
        """Append what was written with `oplog` since the last flush to the served file."""
        assert self.server is not None
        new = self.oplog.entries[self._sent :]
        self._sent = len(self.oplog.entries)
        self.server.append(new)
        return len(new)


def describe(event: dict[str, Any]) -> tuple[Any, ...]:
    ns = event.get("ns") or {}
    key = event.get("documentKey") or {}
    return (event["operationType"], ns.get("db"), ns.get("coll"), key.get("_id"))


def token_time(token: dict[str, Any]) -> Timestamp:
    return rt.decode(token).cluster_time


def token_order(token: dict[str, Any]) -> Any:
    return rt.sort_key(token)


def drain(stream: Any, want: int, tries: int = 200) -> list[dict[str, Any]]:
    """`try_next` until `want` events came (or `tries` empty polls: a hang guard)."""
    events: list[dict[str, Any]] = []
    while len(events) < want and tries:
        event = stream.try_next()
        if event is None:
            tries -= 1
        else:
            events.append(event)
    return events


async def adrain(stream: Any, want: int, tries: int = 200) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while len(events) < want and tries:
        event = await stream.try_next()
        if event is None:
            tries -= 1
        else:
            events.append(event)
    return events


LOG_GUARD_S = 60.0  # a hang guard only


def wait_for_log(pattern: str, log_path: pathlib.Path, proc: subprocess.Popen[bytes]) -> re.Match:
    """The first match of `pattern` in a subprocess server's log file, once it is there (the
    server must still run meanwhile)."""
    deadline = time.monotonic() + LOG_GUARD_S
    while (match := re.search(pattern, log_path.read_text())) is None:
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.02)
    return match
