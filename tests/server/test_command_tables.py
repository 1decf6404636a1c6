"""The command table of each server mode, and the one cursor registry.

`tests/data/command_tables.json` lists every mode's table (command name -> the qualified name of
its handler; `"*"` is a table's default entry, `Route(...)` an entry that picks its handler per
request). A change of registration shows up as a diff of that file: after an intended change,
regenerate it with

    .venv/bin/python tests/server/test_command_tables.py

(`regenerate()` below) and review the diff.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import pytest
from bson.int64 import Int64
from pymongo import MongoClient
from pymongo.errors import OperationFailure

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script (regenerate)
    sys.path.insert(0, str(ROOT))

from cdcserver.commands import tables  # noqa: E402
from cdcserver.commands.tables import describe  # noqa: E402
from cdcserver.context import CommandTable, Route  # noqa: E402
from cdcserver.cursors import (  # noqa: E402
    CHANGE_STREAM,
    FORWARDED,
    OPLOG_FIND,
    QUERY_RESULT,
    kind_of,
)
from cdcserver.deployment import server_state  # noqa: E402
from cdcserver.deployments import for_oplog  # noqa: E402
from cdcserver.deployments.cluster import CLUSTER  # noqa: E402
from cdcserver.deployments.embedded import EMBEDDED  # noqa: E402
from cdcserver.deployments.recorded import RECORDED  # noqa: E402
from cdcserver.deployments.recorded_shards import RECORDED_SHARDS  # noqa: E402
from cdcserver.deployments.shard import SHARD  # noqa: E402
from cdcserver.deployments.sidecar import SIDECAR  # noqa: E402
from cdcserver.deployments.upstream import UPSTREAM, UpstreamDeployment  # noqa: E402
from cdcserver.sources.base import OplogLog  # noqa: E402
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions  # noqa: E402
from cdcserver.testing import EmbeddedServer, ThreadServer  # noqa: E402

LISTING = pathlib.Path(__file__).parent.parent / "data" / "command_tables.json"
GUARD_S = 20.0  # bounds a wait for the upstream; never a performance expectation


def mode_tables() -> dict[str, CommandTable]:
    """Every mode's table, each from its module of cdcserver/deployments/."""
    every = (RECORDED, EMBEDDED, UPSTREAM, SHARD, CLUSTER, RECORDED_SHARDS, SIDECAR)
    return {table.mode: table for table in every}


def listing() -> dict[str, dict[str, str]]:
    return {mode: describe(table) for mode, table in mode_tables().items()}


def regenerate() -> None:
    """Write tests/data/command_tables.json from the tables as they are now."""
    LISTING.parent.mkdir(exist_ok=True)
    LISTING.write_text(json.dumps(listing(), indent=1, sort_keys=True) + "\n")


def test_every_mode_table_is_the_checked_in_listing():
    expected = json.loads(LISTING.read_text())
    actual = listing()
    assert sorted(actual) == sorted(expected)
    for mode in expected:
        added = sorted(set(actual[mode]) - set(expected[mode]))
        removed = sorted(set(expected[mode]) - set(actual[mode]))
        changed = sorted(n for n in set(actual[mode]) & set(expected[mode])
                         if actual[mode][n] != expected[mode][n])
        assert (added, removed, changed) == ([], [], []), (
            f"{mode}: the table changed (regenerate tests/data/command_tables.json if meant)"
        )


def test_no_pseudo_commands_and_every_name_answered():
    for mode, table in mode_tables().items():
        assert not [n for n in table if n.startswith("$")], mode
        state = server_state(for_oplog(OplogLog()))  # no command runs
        for name, entry in table.items():
            if not isinstance(entry, Route):
                assert table.handler(state, name, {name: 1}) is entry, (mode, name)
        assert table.handler(state, "", {}) is None  # an empty command: no handler at all


def test_modes_differ_only_where_their_tables_say():
    """The recorded and embedded tables serve the same names; they differ in the three names
    two families answer and in the commands that need the store (115 with a recorded oplog)."""
    from cdcserver.commands.transactions import needs_store

    recorded, embedded = RECORDED, EMBEDDED
    assert set(recorded) == set(embedded)
    differ = sorted(n for n in recorded if recorded[n] is not embedded[n])
    store_only = sorted(n for n in recorded if recorded[n] is needs_store)
    assert differ == sorted(["aggregate", "listCollections", "listDatabases", *store_only])
    assert store_only == sorted(tables.STORE_ONLY)
    upstream = UPSTREAM
    assert upstream.default is not None and upstream.default in upstream.forwarding
    # find / aggregate / distinct: routed per request (a materialized snapshot read,
    # cdcserver/materialize/snapshot.py)
    assert set(upstream) == {*upstream_local_names(), "aggregate", "distinct", "find",
                             "getMore", "killCursors"}


def upstream_local_names() -> set[str]:
    from cdcserver.commands.proxy import LOCAL_COMMANDS

    return set(LOCAL_COMMANDS)


def test_a_recorded_oplog_answers_the_store_commands_with_115(tmp_path):
    """What the recorded table says, over the wire: the store's commands answer 115 (whether
    its entry is needs_store or a handler that looks for the store), the catalog commands list
    the oplog's namespaces, a change stream and a find on the oplog are served."""
    from cdcserver.testing import start_server, write_oplog
    from tests.support.oplog_builders import Oplog

    oplog = Oplog()
    oplog.insert("rec.c", {"_id": 1})
    oplog.insert("rec.d", {"_id": 2})
    path = write_oplog(tmp_path / "oplog.bson", oplog.entries)
    server = start_server(path)
    try:
        with MongoClient(server.direct_uri, serverSelectionTimeoutMS=5000) as client:
            db = client.rec
            commands = [
                {"insert": "c", "documents": [{"_id": 3}]},
                {"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}}]},
                {"create": "e"}, {"drop": "c"}, {"distinct": "c", "key": "_id"},
                {"listIndexes": "c"}, {"createIndexes": "c", "indexes": [
                    {"key": {"a": 1}, "name": "a_1"}]},
            ]
            for cmd in commands:
                with pytest.raises(OperationFailure) as failed:
                    db.command(cmd)
                assert failed.value.code == 115, cmd
                assert "writes need the embedded store" in str(failed.value.details), cmd
            assert sorted(db.list_collection_names()) == ["c", "d"]
            assert "rec" in client.list_database_names()
            stream = db.command("aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={})
            assert _kinds(server)[stream["cursor"]["id"]] == CHANGE_STREAM
            found = client.local.command("find", "oplog.rs", filter={"ns": "rec.d"})
            assert [e["o"] for e in found["cursor"]["firstBatch"]] == [{"_id": 2}]
    finally:
        server.stop()


# -- the cursor registry ---------------------------------------------------------------------


def _kinds(server: ThreadServer) -> dict[int, str]:
    return server.call(lambda: {cid: kind_of(c) for cid, c in server.state.cursors.open.items()})


def _reap_all(server: ThreadServer) -> int:
    def reap() -> int:
        cursors = server.state.cursors
        cursors.idle_timeout_s = -1.0  # every cursor not checked out counts as idle
        try:
            return cursors.reap()
        finally:
            cursors.idle_timeout_s = 600.0

    return server.call(reap)


def _open_local_cursors(client: MongoClient) -> dict[str, tuple[str, int]]:
    """One cursor of each kind the embedded server holds: kind -> (ns, id)."""
    db = client.reg
    stream = db.command("aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={})
    found = db.command("find", "c", batchSize=2)
    oplog = client.local.command("find", "oplog.rs", batchSize=1)
    out = {
        CHANGE_STREAM: ("reg.c", stream["cursor"]["id"]),
        QUERY_RESULT: ("reg.c", found["cursor"]["id"]),
        OPLOG_FIND: ("local.oplog.rs", oplog["cursor"]["id"]),
    }
    assert all(cid for _, cid in out.values())
    return out


def _get_more_fails_43(client: MongoClient, ns: str, cid: int) -> None:
    db, _, coll = ns.partition(".")
    with pytest.raises(OperationFailure) as failed:
        client[db].command("getMore", Int64(cid), collection=coll)
    assert failed.value.code == 43


@pytest.fixture
def embedded():
    server = EmbeddedServer()
    try:
        with MongoClient(server.direct_uri, serverSelectionTimeoutMS=5000) as client:
            client.reg.c.insert_many([{"_id": i} for i in range(10)])
            yield server, client
    finally:
        server.stop()


def test_every_kind_lives_in_the_one_registry_and_is_killed(embedded):
    server, client = embedded
    opened = _open_local_cursors(client)
    kinds = _kinds(server)
    assert {kind: kinds[cid] for kind, (_, cid) in opened.items()} == {k: k for k in opened}
    for kind, (ns, cid) in opened.items():
        db, _, coll = ns.partition(".")
        reply = client[db].command("killCursors", coll, cursors=[Int64(cid)])
        assert reply["cursorsKilled"] == [cid], kind
        _get_more_fails_43(client, ns, cid)
    assert _kinds(server) == {}


def test_the_one_reaper_reaps_every_kind(embedded):
    server, client = embedded
    opened = _open_local_cursors(client)
    assert _reap_all(server) == len(opened)
    for ns, cid in opened.values():
        _get_more_fails_43(client, ns, cid)
    assert _kinds(server) == {}


class UpstreamServer(ThreadServer):
    """cdcserver whose source is the live upstream at `uri` (`serve --upstream`)."""

    def __init__(self, uri: str) -> None:
        self._options = UpstreamOptions(uri=uri)
        super().__init__(
            make_deployment=lambda: UpstreamDeployment(UpstreamOplog(self._options)))


def test_forwarded_cursors_are_in_the_registry_reaped_and_killed():
    upstream = EmbeddedServer()
    sidecar = None
    try:
        with MongoClient(upstream.direct_uri, serverSelectionTimeoutMS=5000) as a:
            a.reg.c.insert_many([{"_id": i} for i in range(10)])
        sidecar = UpstreamServer(upstream.direct_uri)
        assert sidecar.run(sidecar.state.oplog.wait_ready(GUARD_S), timeout=GUARD_S + 5)
        with MongoClient(sidecar.direct_uri, serverSelectionTimeoutMS=5000) as b:
            first = b.reg.command("find", "c", batchSize=2)["cursor"]["id"]
            stream = b.reg.command("aggregate", "c", pipeline=[{"$changeStream": {}}],
                                   cursor={})["cursor"]["id"]
            assert _kinds(sidecar) == {first: FORWARDED, stream: CHANGE_STREAM}
            # The upstream still holds the forwarded cursor: reaping forgets where it lives.
            assert _reap_all(sidecar) == 2
            assert _kinds(sidecar) == {}
            second = b.reg.command("find", "c", batchSize=2)["cursor"]["id"]
            assert _kinds(sidecar) == {second: FORWARDED}
            more = b.reg.command("getMore", Int64(second), collection="c", batchSize=2)
            assert more["cursor"]["id"] == second and _kinds(sidecar) == {second: FORWARDED}
            killed = b.reg.command("killCursors", "c", cursors=[Int64(second)])
            assert killed["cursorsKilled"] == [second]
            assert _kinds(sidecar) == {}
            _get_more_fails_43(b, "reg.c", second)
            # The forwarded `first`, forgotten here, is still the upstream's to kill.
            killed = b.reg.command("killCursors", "c", cursors=[Int64(first)])
            assert killed["cursorsKilled"] == [first]
    finally:
        if sidecar is not None:
            sidecar.stop()
        upstream.stop()


def test_a_sharded_fronts_cursors_are_reaped():
    from cdcserver.sharding.testing import ShardedServer

    front = ShardedServer(shards=2)
    try:
        with MongoClient(front.uri, serverSelectionTimeoutMS=5000) as client:
            client.admin.command("enableSharding", "reg")
            client.admin.command("shardCollection", "reg.s", key={"_id": 1})
            client.reg.s.insert_many([{"_id": i} for i in range(10)])
            client.reg.u.insert_many([{"_id": i} for i in range(10)])
            merged = client.reg.command("find", "s", batchSize=2)["cursor"]["id"]
            shard = client.reg.command("find", "u", batchSize=2)["cursor"]["id"]
            stream = client.reg.command("aggregate", "s", pipeline=[{"$changeStream": {}}],
                                        cursor={})["cursor"]["id"]
            assert _kinds(front) == {merged: QUERY_RESULT, shard: FORWARDED,
                                     stream: CHANGE_STREAM}
            assert _reap_all(front) == 3
            assert _kinds(front) == {}
            assert front.call(lambda: dict(front.cluster.cursor_owner)) == {}
            _get_more_fails_43(client, "reg.s", merged)
    finally:
        front.stop()


def test_a_checked_out_cursor_is_never_reaped():
    """A cursor checked out by a getMore is never reaped, whatever its idle time."""
    server = EmbeddedServer()
    try:
        with MongoClient(server.direct_uri, serverSelectionTimeoutMS=5000) as client:
            client.reg.c.insert_many([{"_id": i} for i in range(5)])
            cid = client.reg.command("find", "c", batchSize=1)["cursor"]["id"]

            def reap_while_busy() -> int:
                cursor = server.state.cursors.open[cid]
                cursor.busy = True
                cursor.last_used = time.monotonic() - 3600
                try:
                    server.state.cursors.idle_timeout_s = 1.0
                    return server.state.cursors.reap()
                finally:
                    cursor.busy = False
                    server.state.cursors.idle_timeout_s = 600.0

            assert server.call(reap_while_busy) == 0
            assert _kinds(server) == {cid: QUERY_RESULT}
    finally:
        server.stop()


if __name__ == "__main__":
    regenerate()
    print(f"wrote {LISTING}")
