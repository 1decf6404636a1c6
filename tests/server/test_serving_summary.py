"""The `serving` line of a restarted sidecar (issue 29): its range and count are its retained
log's, not its empty live window's."""

from __future__ import annotations

import time

import bson
from bson import Timestamp

from cdcserver.config import Config, UpstreamConfig
from cdcserver.logs import serving_summary
from cdcserver.sources.mongo_common import UpstreamOptions
from cdcserver.sources.mongo_tail import UpstreamOplog


def test_a_restarted_sidecar_counts_its_retained_entries(tmp_path) -> None:
    uri = "mongodb://127.0.0.1:1/"
    options = UpstreamOptions(uri=uri, retain_dir=str(tmp_path))
    first = UpstreamOplog(options)
    assert first.retained is not None
    now = int(time.time())  # retain_hours keeps recent entries only
    entries = [{"ts": Timestamp(now + i, 1), "t": bson.Int64(1), "op": "n",
                "ns": "", "o": {"msg": "x"}, "v": 2, "wall": None} for i in range(3)]
    first.retained.append([(e["ts"], bson.encode(e)) for e in entries])
    first.retained.close()
    restarted = UpstreamOplog(options)  # as after a restart: nothing tailed yet
    try:
        config = Config(upstream=UpstreamConfig(uri=uri))
        line = serving_summary(config, restarted, 27017, None)
    finally:
        assert restarted.retained is not None
        restarted.retained.close()
    assert "serving the replica set at mongodb://127.0.0.1:1/;" in line, line
    assert f"; oplog 3 entries, Timestamp({now}, 1)" in line, line
    assert f"to Timestamp({now + 2}, 1)" in line, line
