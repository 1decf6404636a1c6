"""`$_internalChangeStreamCheckInvalidate`: the `invalidate` event and the end of the stream.

Collection streams end on a drop of the collection, a rename of it or onto it, or a drop of its
database; database streams on dropDatabase; cluster streams never (reference §5). The
invalidating event is returned, then `invalidate` with the same token but fromInvalidate, then
the cursor closes. A stream opened with `startAfter` an invalidate token swallows that one
invalidate (the resume stages swallow it) and keeps going.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.transform import invalidate_event


class CheckInvalidate:
    def __init__(self, spec: ChangeStreamSpec) -> None:
        self.scope = spec.scope
        self.db = spec.db
        self.coll = spec.coll
        token = spec.resume_token
        # `_data` of a startAfter invalidate token: that invalidate is not repeated.
        self._start_after_invalidate: str | None = (
            spec.start_after["_data"].upper()
            if spec.start_after is not None and token is not None and token.from_invalidate
            else None
        )
        self.invalidated = False

    def is_invalidating(self, event: Mapping[str, Any]) -> bool:
        kind = event["operationType"]
        if self.scope == "collection":
            ns: Mapping[str, str] = event["ns"]
            if kind == "drop":
                return ns["db"] == self.db and ns["coll"] == self.coll
            if kind == "rename":
                to: Mapping[str, str] = event["to"]
                return (ns["db"] == self.db and ns["coll"] == self.coll) or (
                    to["db"] == self.db and to["coll"] == self.coll
                )
            return kind == "dropDatabase" and ns["db"] == self.db
        if self.scope == "database":
            if kind != "dropDatabase":
                return False
            db: str = event["ns"]["db"]
            return db == self.db
        return False

    def process(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Events up to and including the invalidate; sets `invalidated` when it was reached."""
        if self.invalidated:
            return []
        if self.scope == "cluster":
            return events
        out: list[dict[str, Any]] = []
        for event in events:
            out.append(event)
            if not self.is_invalidating(event):
                continue
            invalidate = invalidate_event(event)
            out.append(invalidate)
            if self._start_after_invalidate == invalidate["_id"]["_data"]:
                # The client started after this very invalidate: the resume stages swallow it
                # and the stream goes on (only the first one; later ones close it).
                self._start_after_invalidate = None
                continue
            self.invalidated = True
            break
        return out
