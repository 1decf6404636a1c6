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
