"""What the sidecar's image lookups ask of a materializer (a Protocol, so that sources/ need
not import the materializer, which imports sources/)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class CopyImages(Protocol):
    async def answer_pre_images(
        self, ids: Sequence[Mapping[str, Any]], answers: Any, timeout_s: float
    ) -> list[Mapping[str, Any]]:
        """Put into `answers` (a LookupAnswers) the pre-images of `ids` the copy holds at the
        event's own time; return the ids it cannot answer (not materialized, or before the
        copy's consistent point), for the upstream path."""
        ...

    def status(self) -> dict[str, Any]:
        """The copy's state, for serverStatus's `materialized` section and the metrics."""
        ...


def status_section(status: Mapping[str, Any]) -> dict[str, Any]:
    """A copy's `status()` as serverStatus shows it: counters as 64-bit integers (mongod's
    serverStatus counters are longs), the rest as it is."""
    from bson.int64 import Int64

    return {k: Int64(v) if isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in status.items()}


def insert_section(reply: Mapping[str, Any], name: str, value: Any) -> dict[str, Any]:
    """`reply` (a serverStatus) with section `name` in its place: the sections follow
    `localTime` in name order (mongod's section registry is a sorted map), before `ok`."""
    out: dict[str, Any] = {}
    sections = False
    placed = False
    for key, item in reply.items():
        if not placed and sections and (key > name or key in ("ok", "operationTime")
                                        or key.startswith("$")):
            out[name] = value
            placed = True
        out[key] = item
        if key == "localTime":
            sections = True
    if not placed:
        out[name] = value
    return out
