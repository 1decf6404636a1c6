"""A live replica set (or each shard of a sharded cluster) as the source: the facade.

The upstream source is split along what it asks of mongod:

* `mongo_tail.py`: `UpstreamOplog`, the tailable cursor on `local.oplog.rs`, the majority
  commit point, the live window, reconnects and the retained log's feeding;
* `mongo_history.py`: history segments behind the window, and the transaction entries a push
  says it needs;
* `mongo_images.py`: pre-images and updateLookup documents a push says it needs;
* `mongo_common.py`: options, errors, the raw codec and cursor helpers they share.
"""

from cdcserver.sources.mongo_common import (
    CAPPED_POSITION_LOST,
    CLOSE_TIMEOUT_S,
    MAX_TS,
    NOT_PRIMARY_CODES,
    RAW,
    UpstreamError,
    UpstreamOptions,
    history_lost,
    next_ts,
    upstream_unavailable,
)
from cdcserver.sources.mongo_history import Segment, UpstreamHistory
from cdcserver.sources.mongo_images import UpstreamImages
from cdcserver.sources.mongo_tail import UpstreamOplog

__all__ = [
    "CAPPED_POSITION_LOST",
    "CLOSE_TIMEOUT_S",
    "MAX_TS",
    "NOT_PRIMARY_CODES",
    "RAW",
    "Segment",
    "UpstreamError",
    "UpstreamHistory",
    "UpstreamImages",
    "UpstreamOplog",
    "UpstreamOptions",
    "history_lost",
    "next_ts",
    "upstream_unavailable",
]
