"""The feature compatibility version: `setFeatureCompatibilityVersion` and what
`getParameter` / `serverStatus` report, as mongod answers them (set_feature_compatibility_
version_command.cpp).

As mongod, the version is the document `{_id: "featureCompatibilityVersion", version}` of
`admin.system.version` on a server with a store (durable with it); a sidecar answers its
upstream's (sources/upstream_version.py); a recorded oplog's server keeps it in memory. The
versions a release accepts are its own and the one before (8.0: 7.0, 8.0; 9.0: 8.0, 9.0), as
mongod's lastLTS / latest.

With a store, a change goes through mongod's transitional document first (upgrading:
`{version: <from>, targetVersion: <to>}`; downgrading: `{version, targetVersion: <to>,
previousVersion: <from>}`), then the final `{version: <to>}`. In between, a release whose FCV
makes time-series collections viewless (9.0: `Release.viewless_timeseries_fcv`) converts every
one of them, each logged as one `upgradeDowngradeViewlessTimeseries` entry (upgrade to it), or
back (downgrade below it), as setFeatureCompatibilityVersion's upgradeAllTimeseriesToViewless /
downgradeAllTimeseriesFromViewless do on a replica set.

A front's coordinator (sharding/router/admin.py) sends each shard the config server's phases
one at a time (`phase: "start" | "prepare" | "complete"` with `fromConfigServer: true`: the
transitional document, the conversions, the final document). A transitional state is taken as
mongod's FCVTransitions take it: the same target again finishes the transition, an upgrade under
way may turn back down, a downgrade under way may not go back up (5147403).
"""

from __future__ import annotations

from typing import Any

from cdcserver.commands.arguments import is_string, wrong_type
from cdcserver.commands.base import Handler, family
from cdcserver.context import ConnectionState, ServerState
from cdcserver.embedded.store import Store
from cdcserver.embedded.store_types import id_key
from cdcserver.sources.upstream_version import fcv_fields
from pipeline_stages.errors import MongoError

TABLE: dict[str, Handler] = {}
command = family(TABLE)

_SYSTEM_VERSION = ("admin", "system.version")
_FCV_ID = "featureCompatibilityVersion"
# Each release's accepted FCVs: the previous LTS and its own.
_ACCEPTED = {"8.0": ("7.0", "8.0"), "9.0": ("8.0", "9.0")}


class _InMemoryVersion:
    def __init__(self) -> None:
        self.version: str | None = None


def fcv_document(server: ServerState) -> dict[str, Any]:
    """The FCV as getParameter / serverStatus show it: `{version[, targetVersion,
    previousVersion]}` (the last two while an upgrade or downgrade is under way). The store's
    document; a sidecar's upstream's as it follows it (sources/upstream_version.py); else
    the one set here, else the release's."""
    store = server.store
    if store is not None:
        coll = store.get(*_SYSTEM_VERSION)
        if coll is not None:
            doc = store.documents(coll).get(id_key(_FCV_ID))
            fields = fcv_fields(doc) if doc is not None else None
            if fields is not None:
                return fields
    upstream = server.oplog.upstream_fcv()
    if upstream is not None:
        return dict(upstream)
    held = server.part(_InMemoryVersion).version
    return {"version": held if held is not None else server.release.fcv}


def feature_compatibility_version(server: ServerState) -> str:
    return str(fcv_document(server)["version"])


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


@command("setFeatureCompatibilityVersion")
async def set_feature_compatibility_version(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    if db != "admin":
        raise MongoError(
            13, "setFeatureCompatibilityVersion may only be run against the admin database.")
    requested = cmd.get("setFeatureCompatibilityVersion")
    if not is_string(requested):
        raise wrong_type("setFeatureCompatibilityVersion.setFeatureCompatibilityVersion",
                         requested, "string")
    requested = str(requested)
    accepted = _ACCEPTED.get(server.release.name, (server.release.fcv,))
    if requested not in accepted:
        raise MongoError(
            2, f"Enumeration value '{requested}' for field 'setFeatureCompatibilityVersion' is "
            "not a valid value.")
    confirm = cmd.get("confirm")
    if confirm is not None and not isinstance(confirm, bool):
        raise wrong_type("setFeatureCompatibilityVersion.confirm", confirm, "bool")
    current = fcv_document(server)
    actual = str(current["version"])
    target = current.get("targetVersion")
    if target is None and requested == actual:
        return {}  # already there (a phase of a transition this shard has finished too)
    if target is not None and requested not in (target, actual):
        # Downgrading (version == targetVersion): the other way is not a transition mongod
        # permits (FCVTransitions); upgrading, both ways are (retry, or downgrade back).
        raise MongoError(5147403, f"cannot set featureCompatibilityVersion to '{requested}' "
                         "while featureCompatibilityVersion is 'downgrading from "
                         f"{current.get('previousVersion')} to {target}'")
    upgrading = version_key(requested) > version_key(actual)
    if confirm is not True:
        if upgrading:
            message = (
                f"Once you have upgraded to {requested}, you will not be able to downgrade FCV "
                "and binary version without support assistance. Please re-run this command "
                "with 'confirm: true' to acknowledge this and continue with the FCV upgrade.")
        else:
            message = (
                "Once you have downgraded the FCV, if you choose to downgrade the binary "
                "version, it will require support assistance. Please re-run this command with "
                "'confirm: true' to acknowledge this and continue with the FCV downgrade.")
        raise MongoError(7369100, message)
    store = server.store
    if store is None:
        server.part(_InMemoryVersion).version = requested
        return {}
    if target is None or target == requested:
        origin = actual if target is None else str(current.get("previousVersion", actual))
    else:  # back from an upgrade under way: downgrading from the version it was going to
        origin = str(target)
    transitional: dict[str, Any] = (
        {"_id": _FCV_ID, "version": actual, "targetVersion": requested} if upgrading
        else {"_id": _FCV_ID, "version": requested, "targetVersion": requested,
              "previousVersion": origin})
    # The config server's phases (a front's coordinator sends them: sharding/router/
    # admin.py); without one, all three at once.
    phase = cmd.get("phase") if cmd.get("fromConfigServer") is True else None
    viewless_from = server.release.viewless_timeseries_fcv
    with store.batch():
        if phase in (None, "start") and current != fcv_fields(transitional):
            _write_fcv(store, transitional)
        if phase in (None, "prepare") and viewless_from is not None:
            # Whatever a failed attempt converted already stays converted.
            after = version_key(requested) >= version_key(viewless_from)
            for db, coll in store.timeseries_collections(viewless=not after):
                store.convert_timeseries(db, coll, to_viewless=after)
        if phase in (None, "complete"):
            _write_fcv(store, {"_id": _FCV_ID, "version": requested})
    return {}


def _write_fcv(store: Store, doc: dict[str, Any]) -> None:
    coll = store.ensure_collection(*_SYSTEM_VERSION)
    pre = store.documents(coll).get(id_key(_FCV_ID))
    if pre is None:
        store.insert_document(coll, doc)
    else:
        store.update_document(coll, pre, doc, kind="replacement", update=doc)
