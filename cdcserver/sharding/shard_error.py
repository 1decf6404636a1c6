"""A shard's error reply, raised where the front (or the cluster's merger) got it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdcserver.commands import failpoints


class ShardError(failpoints.FailPointError):
    """A shard's error reply, passed on as it is (its labels are final)."""

    def __init__(self, reply: Mapping[str, Any]) -> None:
        extra = {
            k: v for k, v in reply.items()
            if k not in ("ok", "errmsg", "code", "codeName", "errorLabels", "$clusterTime",
                         "operationTime")
        }
        super().__init__(int(reply.get("code", 1)), str(reply.get("errmsg", "")),
                         list(reply.get("errorLabels", [])), extra)
