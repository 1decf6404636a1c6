"""The copy's state where operators look: serverStatus's `materialized` section and the
metrics port's `cdcserver_materialized_*` (on a sidecar of a replica set here; of a sharded
cluster, per shard, in test_sharded.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from cdcserver.metrics import Metrics, MetricsEndpoint
from cdcserver.testing import HOST
from tests.materialize.support import MaterializedSidecar, raw_client
from tests.server.test_metrics import scrape, value
from tests.server.test_upstream import latest_ts
from tests.support.embedded_support import EmbeddedServer

BEFORE = {"fullDocumentBeforeChange": "required"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, int]]:
    a = EmbeddedServer()
    b = None
    endpoint = None
    try:
        raw_client(a.uri).shop.items.insert_many([{"_id": i, "n": 0} for i in range(3)])
        b = MaterializedSidecar(a.uri, str(tmp_path_factory.mktemp("b")), ["shop.*"])
        b.wait_applied(latest_ts(a))

        def attach() -> MetricsEndpoint:
            assert b is not None
            b.state.metrics = Metrics(b.state)
            return MetricsEndpoint(b.state.metrics)

        endpoint = b.call(attach)
        port = b.run(endpoint.start(HOST, 0))
        yield a, b, port
    finally:
        if b is not None:
            if endpoint is not None:
                b.run(endpoint.close())
            b.stop()
        a.stop()


def server_status(b: MaterializedSidecar) -> dict[str, Any]:
    with b.client() as client:
        return client.admin.command("serverStatus")


def test_server_status_has_the_copys_section_in_its_place(pair):
    a, b, _ = pair
    b.wait_applied(latest_ts(a))
    reply = server_status(b)
    keys = list(reply)
    # mongod's sections in name order: between featureCompatibilityVersion and metrics.
    assert keys.index("featureCompatibilityVersion") < keys.index("materialized") < \
        keys.index("metrics")
    section = reply["materialized"]
    assert section["state"] == "ready"
    assert section["patterns"] == ["shop.*"]
    assert section["appliedThrough"] >= latest_ts(a)
    assert section["consistentAt"] <= section["appliedThrough"]
    assert section["lagSeconds"] == 0.0
    assert section["collections"] == 1
    assert section["versions"] >= 3 and section["versionBytes"] > 0
    assert section["resyncs"] == 0 and section["failures"] == 0
    with b.client(document_class=RawBSONDocument) as client:
        raw = client.admin.command("serverStatus")["materialized"]
    assert isinstance(raw["versions"], Int64)  # counters are longs, as mongod's are
    assert "materialized" not in (b.client().admin.command({"serverStatus": 1,
                                                             "materialized": 0}))


def test_server_status_and_metrics_follow_writes_and_images(pair):
    a, b, port = pair
    before = server_status(b)["materialized"]
    ca = raw_client(a.uri)
    with b.client() as client, client.shop.items.watch(
            [], full_document_before_change="required") as stream:
        ca.shop.items.update_one({"_id": 1}, {"$inc": {"n": 1}})
        ca.shop.items.insert_one({"_id": 9})
        event = stream.next()
        assert event["fullDocumentBeforeChange"] == {"_id": 1, "n": 0}
    b.wait_applied(latest_ts(a))
    after = server_status(b)["materialized"]
    assert after["appliedThrough"] > before["appliedThrough"]
    assert after["versions"] == before["versions"] + 2  # the update's and the insert's
    assert after["versionBytes"] > before["versionBytes"]
    assert after["imagesServed"] == before["imagesServed"] + 1

    samples = scrape(port)
    assert value(samples, "cdcserver_materialized_ready") == 1.0
    assert value(samples, "cdcserver_materialized_applied_timestamp_seconds") == \
        after["appliedThrough"].time
    assert value(samples, "cdcserver_materialized_consistent_timestamp_seconds") == \
        after["consistentAt"].time
    assert value(samples, "cdcserver_materialized_lag_seconds") == 0.0
    assert value(samples, "cdcserver_materialized_versions") == after["versions"]
    assert value(samples, "cdcserver_materialized_version_bytes") == after["versionBytes"]
    assert value(samples, "cdcserver_materialized_images_served_total") == \
        after["imagesServed"]
    assert value(samples, "cdcserver_materialized_resyncs_total") == 0.0
    assert value(samples, "cdcserver_materialized_failures_total") == 0.0
    ca.close()


def test_a_server_without_a_copy_has_neither(tmp_path):
    a = EmbeddedServer()
    try:
        with raw_client(a.uri) as client:
            assert "materialized" not in client.admin.command("serverStatus")
        text = a.call(lambda: Metrics(a.state).exposition()).decode()
        assert "cdcserver_materialized_" not in text
    finally:
        a.stop()
