"""What a sidecar follows of its upstream's version besides its binary (hello's
maxWireVersion, `UpstreamOplog._note_release`): the feature compatibility version, and the
oplog entries of a release it does not know.

The FCV is the document `{_id: "featureCompatibilityVersion", version[, targetVersion,
previousVersion]}` of the upstream's `admin.system.version`: read with `getParameter` when the
tail connects, then taken from the oplog as its writes pass (an insert or replacement holds the
whole document; a delta makes the next `hello` poll read it again). So the sidecar's
getParameter / serverStatus answer, in the order of the events, what the upstream answered.

An entry a release does not write (a command outside `Release.oplog_commands`, an unknown `op`)
is passed through as mongod's change streams take it: their filter matches no such command,
so no stream sees it, and nothing fails. It is logged once per command name, never skipped in
silence (a newer upstream than the sidecar knows)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pipeline_stages.oplog_entry import Entry
from pipeline_stages.release import Release

log = logging.getLogger(__name__)

FCV_ID = "featureCompatibilityVersion"
_KNOWN_OPS = frozenset({"i", "u", "d", "c", "n"})
_FCV_FIELDS = ("version", "targetVersion", "previousVersion")


def fcv_fields(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The FCV document's fields as getParameter shows them (`_id` left out), or None when
    `doc` holds no version."""
    if not isinstance(doc.get("version"), str):
        return None
    return {k: doc[k] for k in _FCV_FIELDS if isinstance(doc.get(k), str)}


class UpstreamVersion:
    def __init__(self) -> None:
        self.fcv: dict[str, Any] | None = None  # as getParameter answers it; None: not read
        self.stale = True  # read it with getParameter at the next chance
        self._warned: set[str] = set()

    async def refresh(self, client: Any) -> None:
        """Read the upstream's FCV (getParameter); on failure it stays stale, tried again."""
        try:
            reply = await client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
        except Exception as exc:  # noqa: BLE001 - an old or restricted upstream: next time
            log.debug("upstream getParameter featureCompatibilityVersion: %s", exc)
            return
        found = reply.get("featureCompatibilityVersion")
        fields = fcv_fields(found) if isinstance(found, Mapping) else None
        if fields is not None:
            self._take(fields)
        self.stale = False

    def note_version_write(self, entry: Entry) -> None:
        """An entry on `admin.system.version` (insert or update)."""
        o = entry.get("o")
        if not isinstance(o, Mapping):
            return
        key = o.get("_id") if entry.get("op") == "i" else (entry.get("o2") or {}).get("_id")
        if key != FCV_ID:
            return
        fields = fcv_fields(o) if "$v" not in o and "diff" not in o else None
        if fields is None:
            self.stale = True  # a delta: read the whole document again
            return
        self._take(fields)

    def note_command(self, entry: Entry, release: Release | None) -> None:
        o = entry.get("o")
        name = next(iter(o), None) if isinstance(o, Mapping) else None
        if release is None or not isinstance(name, str) or name in release.oplog_commands:
            return
        self._warn(name, entry, release,
                   f"a command MongoDB {release.name} does not write ({name!r})")

    def note_unknown_op(self, entry: Entry, release: Release | None) -> None:
        op = entry.get("op")
        if op in _KNOWN_OPS or release is None:
            return
        self._warn(f"op:{op}", entry, release, f"an unknown op type {op!r}")

    def _warn(self, key: str, entry: Entry, release: Release, what: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("upstream oplog entry at %s (%s) is %s: passed through, no change stream "
                    "matches it (as mongod's filter takes an entry it does not know); the "
                    "upstream may be newer than MongoDB %s. Logged once.",
                    entry.get("ts"), entry.get("ns"), what, release.name)

    def _take(self, fields: dict[str, Any]) -> None:
        if fields != self.fcv:
            if self.fcv is not None:
                log.info("the upstream's featureCompatibilityVersion is now %s", fields)
            self.fcv = fields
