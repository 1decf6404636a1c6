"""A unified-test-format runner for pymongo (specifications/unified-test-format).

It runs the drivers' specification tests against one server (here: cdcserver's embedded store).
What it supports is what the change-stream, retryable-reads, collection-management and CSOT
files use, plus the common CRUD operations: entities client / database / collection / session
(and change streams, cursors and values saved with `saveResultAsEntity`), `initialData`,
`runOnRequirements`, the `failPoint`, `createEntities` and collection/index assertion
operations, command-monitoring `expectEvents`, `expectResult` / `expectError` with every
matching operator, and `outcome`. Anything else is refused loudly (a test error), never
skipped silently.
"""

from __future__ import annotations

import contextlib
import copy
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pymongo
from bson import SON, json_util
from bson.binary import Binary
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from pymongo import MongoClient, monitoring
from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    InvalidOperation,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
)
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference, read_pref_mode_from_name
from pymongo.results import BulkWriteResult
from pymongo.server_api import ServerApi
from pymongo.synchronous.change_stream import ChangeStream
from pymongo.synchronous.client_session import ClientSession
from pymongo.synchronous.collection import Collection
from pymongo.synchronous.command_cursor import CommandCursor
from pymongo.synchronous.cursor import Cursor
from pymongo.synchronous.database import Database
from pymongo.write_concern import WriteConcern

SCHEMA_VERSION = (1, 21)
# iterateUntilDocumentOrError waits at most this long (a guard against a hang, not a timing
# expectation: the tests' documents are written before they are awaited).
ITERATE_LIMIT_S = 20.0
# heartbeatFrequencyMS of the clients of a test that configures fail points (fast_heartbeats
# lowers pymongo's floor below its 500 ms).
FAST_HEARTBEAT_MS = 50
SENSITIVE_COMMANDS = frozenset(
    {"authenticate", "saslstart", "saslcontinue", "getnonce", "createuser", "updateuser",
     "copydbgetnonce", "copydbsaslstart", "copydb"}
)
JSON_OPTIONS = json_util.JSONOptions(tz_aware=False)


class SkipTest(Exception):
    """The test cannot apply (its reason is the message)."""


def load_file(path: Any) -> dict[str, Any]:
    """A test file as Extended JSON (relaxed or canonical)."""
    with open(path, encoding="utf-8") as f:
        return json_util.loads(f.read(), json_options=JSON_OPTIONS)


def version_tuple(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


# -- the deployment ---------------------------------------------------------------------------


@dataclass
class Deployment:
    """What runOnRequirements are evaluated against, read from the server once."""

    uri: str
    version: tuple[int, int, int]
    topology: str  # single | replicaset | sharded | load-balanced
    auth: bool = False
    serverless: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def discover(cls, uri: str, client: MongoClient) -> Deployment:
        build = client.admin.command("buildInfo")
        version = tuple(int(x) for x in build["versionArray"][:3])
        hello = client.admin.command("hello")
        if hello.get("msg") == "isdbgrid":
            topology = "sharded"
        elif "setName" in hello:
            topology = "replicaset"
        else:
            topology = "single"
        try:
            parameters = dict(client.admin.command({"getParameter": "*"}))
        except OperationFailure:
            parameters = {}
        return cls(uri, version, topology, parameters=parameters)  # type: ignore[arg-type]

    def unmet(self, requirement: Mapping[str, Any]) -> str | None:
        """Why one runOnRequirement is not satisfied (None: satisfied)."""
        have = ".".join(map(str, self.version))
        low = requirement.get("minServerVersion")
        if low and version_tuple(low) > self.version:
            return f"minServerVersion {low} > server {have}"
        high = requirement.get("maxServerVersion")
        if high and version_tuple(high) < self.version:
            return f"maxServerVersion {high} < server {have}"
        topologies = requirement.get("topologies")
        if topologies and self.topology not in topologies:
            return f"topologies {topologies} (the server is a {self.topology})"
        serverless = requirement.get("serverless")
        if serverless == "require" and not self.serverless:
            return "serverless: require"
        if serverless == "forbid" and self.serverless:
            return "serverless: forbid"
        auth = requirement.get("auth")
        if auth is not None and auth != self.auth:
            return f"auth: {auth} (authentication is {'on' if self.auth else 'off'})"
        if requirement.get("authMechanism"):
            return f"authMechanism {requirement['authMechanism']} (no authentication)"
        if requirement.get("csfle"):
            return "csfle (client-side encryption is not supported)"
        for name, value in (requirement.get("serverParameters") or {}).items():
            if name not in self.parameters or not _values_equal(value, self.parameters[name]):
                return f"serverParameters {name}={value!r}"
        return None

    def unmet_all(self, requirements: list[Mapping[str, Any]] | None) -> str | None:
        """Why none of the requirements is satisfied (None: one is, or there are none)."""
        if not requirements:
            return None
        reasons = [self.unmet(r) for r in requirements]
        if any(r is None for r in reasons):
            return None
        return "runOnRequirements not met: " + "; ".join(r for r in reasons if r)


# -- matching -----------------------------------------------------------------------------------

_TYPE_NAMES: dict[str, Callable[[Any], bool]] = {
    "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, Mapping) and not isinstance(v, DBRef),
    "array": lambda v: isinstance(v, (list, tuple)),
    "binData": lambda v: isinstance(v, (bytes, Binary)),
    "objectId": lambda v: isinstance(v, ObjectId),
    "bool": lambda v: isinstance(v, bool),
    "date": lambda v: _is_datetime(v),
    "null": lambda v: v is None,
    "regex": lambda v: isinstance(v, (Regex, re.Pattern)),
    "dbPointer": lambda v: isinstance(v, DBRef),
    "javascript": lambda v: isinstance(v, Code) and v.scope is None,
    "javascriptWithScope": lambda v: isinstance(v, Code) and v.scope is not None,
    "int": lambda v: _is_int(v) and not isinstance(v, Int64) and -(2**31) <= v < 2**31,
    "timestamp": lambda v: isinstance(v, Timestamp),
    "long": lambda v: isinstance(v, Int64) or (_is_int(v) and not -(2**31) <= v < 2**31),
    "decimal": lambda v: isinstance(v, Decimal128),
    "minKey": lambda v: isinstance(v, MinKey),
    "maxKey": lambda v: isinstance(v, MaxKey),
}
_TYPE_NAMES["number"] = lambda v: _is_number(v)


def _is_datetime(value: Any) -> bool:
    import datetime

    from bson.datetime_ms import DatetimeMS

    return isinstance(value, (datetime.datetime, DatetimeMS))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _values_equal(expected: Any, actual: Any) -> bool:
    """Equal as the test format compares scalars (32/64-bit ints and doubles alike)."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    if _is_number(expected) and _is_number(actual):
        return expected == actual
    if isinstance(expected, (bytes, Binary)) and isinstance(actual, (bytes, Binary)):
        return bytes(expected) == bytes(actual) and getattr(expected, "subtype", 0) == getattr(
            actual, "subtype", 0
        )
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return _normal(expected) == _normal(actual)
    return type(expected) is type(actual) and expected == actual


def _special(value: Any) -> str | None:
    """The `$$operator` a document is, if it is one."""
    if isinstance(value, Mapping) and len(value) == 1:
        key = next(iter(value))
        if isinstance(key, str) and key.startswith("$$"):
            return key
    return None


class Matcher:
    def __init__(self, entities: EntityMap) -> None:
        self.entities = entities

    def match(self, expected: Any, actual: Any, root: bool = True, path: str = "") -> None:
        where = path or "<root>"
        op = _special(expected)
        if op is not None:
            self._operator(op, expected[op], actual, root, path, present=True)
            return
        if isinstance(expected, Mapping):
            if not isinstance(actual, Mapping):
                raise AssertionError(f"{where}: expected a document, got {actual!r}")
            for key, value in expected.items():
                sub = f"{path}.{key}" if path else key
                op = _special(value)
                if op in ("$$exists", "$$unsetOrMatches"):
                    self._operator(
                        op, value[op], actual.get(key), False, sub, present=key in actual
                    )
                    continue
                if key not in actual:
                    raise AssertionError(f"{sub}: missing (expected {value!r}) in {actual!r}")
                self.match(value, actual[key], False, sub)
            if not root:
                extra = [k for k in actual if k not in expected]
                if extra:
                    raise AssertionError(f"{where}: unexpected fields {extra} in {actual!r}")
            return
        if isinstance(expected, (list, tuple)):
            if not isinstance(actual, (list, tuple)):
                raise AssertionError(f"{where}: expected an array, got {actual!r}")
            if len(expected) != len(actual):
                raise AssertionError(
                    f"{where}: expected {len(expected)} elements, got {len(actual)}: {actual!r}"
                )
            for i, (e, a) in enumerate(zip(expected, actual)):
                self.match(e, a, False, f"{path}.{i}" if path else str(i))
            return
        if not _values_equal(expected, actual):
            raise AssertionError(f"{where}: expected {expected!r}, got {actual!r}")

    def _operator(
        self, op: str, arg: Any, actual: Any, root: bool, path: str, present: bool
    ) -> None:
        where = path or "<root>"
        if op == "$$exists":
            if bool(arg) != present:
                raise AssertionError(
                    f"{where}: expected {'presence' if arg else 'absence'}, got "
                    f"{actual if present else 'nothing'!r}"
                )
        elif op == "$$unsetOrMatches":
            if present:
                self.match(arg, actual, root, path)
        elif not present:
            raise AssertionError(f"{where}: missing (expected {op}: {arg!r})")
        elif op == "$$type":
            names = arg if isinstance(arg, list) else [arg]
            for name in names:
                if name not in _TYPE_NAMES:
                    raise ValueError(f"unknown $$type {name!r}")
            if not any(_TYPE_NAMES[n](actual) for n in names):
                raise AssertionError(f"{where}: expected type {names}, got {actual!r}")
        elif op == "$$matchesEntity":
            self.match(self.entities[arg], actual, root, path)
        elif op == "$$matchesHexBytes":
            if not isinstance(actual, (bytes, Binary)) or bytes(actual) != bytes.fromhex(arg):
                raise AssertionError(f"{where}: expected bytes {arg}, got {actual!r}")
        elif op == "$$sessionLsid":
            lsid = self.entities.session_lsid(arg)
            if dict(actual) != dict(lsid):
                raise AssertionError(f"{where}: expected lsid of {arg}, got {actual!r}")
        elif op == "$$lte":
            if not (_is_number(actual) and actual <= arg):
                raise AssertionError(f"{where}: expected <= {arg}, got {actual!r}")
        elif op == "$$matchAsDocument":
            parsed = json_util.loads(actual, json_options=JSON_OPTIONS)
            self.match(arg, parsed, False, path)
        elif op == "$$matchAsRoot":
            self.match(arg, actual, True, path)
        else:
            raise ValueError(f"unsupported matching operator {op}")


# -- command monitoring ---------------------------------------------------------------------------


class EventRecorder(monitoring.CommandListener):
    """The command events of one client entity, as `observeEvents` asks."""

    def __init__(self, observe: list[str], ignore: list[str], sensitive: bool) -> None:
        unknown = set(observe) - {
            "commandStartedEvent", "commandSucceededEvent", "commandFailedEvent"
        }
        if unknown:
            raise NotImplementedError(f"observeEvents {sorted(unknown)} (only command events)")
        self.observe = set(observe)
        self.ignore = {name.lower() for name in ignore} | {"configurefailpoint"}
        self.sensitive = sensitive
        self.events: list[tuple[str, Any]] = []
        self.recording = True

    def _keep(self, kind: str, event: Any) -> None:
        if not self.recording or kind not in self.observe:
            return
        name = event.command_name.lower()
        if name in self.ignore:
            return
        if not self.sensitive and (
            name in SENSITIVE_COMMANDS
            or (name in ("hello", "ismaster") and kind == "commandStartedEvent"
                and not event.command)
        ):
            return
        self.events.append((kind, event))

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self._keep("commandStartedEvent", event)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._keep("commandSucceededEvent", event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._keep("commandFailedEvent", event)


# -- entities -------------------------------------------------------------------------------------


class EntityMap:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.entities: dict[str, Any] = {}
        self.recorders: dict[str, EventRecorder] = {}
        self.lsids: dict[str, Mapping[str, Any]] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.entities:
            raise AssertionError(f"no entity named {name!r}")
        return self.entities[name]

    def __setitem__(self, name: str, value: Any) -> None:
        if name in self.entities:
            raise AssertionError(f"entity {name!r} already exists")
        self.entities[name] = value

    def typed(self, name: str, kind: type | tuple[type, ...]) -> Any:
        value = self[name]
        if not isinstance(value, kind):
            raise AssertionError(f"entity {name!r} is a {type(value).__name__}, not {kind}")
        return value

    def session_lsid(self, name: str) -> Mapping[str, Any]:
        if name not in self.lsids:
            raise AssertionError(f"no session entity named {name!r}")
        return self.lsids[name]

    def create(self, specs: list[Mapping[str, Any]]) -> None:
        for spec in specs:
            if len(spec) != 1:
                raise AssertionError(f"an entity has exactly one key: {spec!r}")
            kind, options = next(iter(spec.items()))
            make = getattr(self, f"_create_{kind}", None)
            if make is None:
                raise NotImplementedError(f"entity type {kind!r}")
            self[options["id"]] = make(options)

    def _create_client(self, spec: Mapping[str, Any]) -> MongoClient:
        kwargs: dict[str, Any] = {}
        recorder = EventRecorder(
            list(spec.get("observeEvents", [])),
            list(spec.get("ignoreCommandMonitoringEvents", [])),
            bool(spec.get("observeSensitiveCommands", False)),
        )
        self.recorders[spec["id"]] = recorder
        kwargs["event_listeners"] = [recorder]
        for key, value in (spec.get("uriOptions") or {}).items():
            if _special(value) == "$$placeholder":
                raise NotImplementedError(f"uriOptions.{key}: $$placeholder")
            kwargs[key] = value
        api = spec.get("serverApi")
        if api:
            kwargs["server_api"] = ServerApi(
                api["version"], strict=api.get("strict"),
                deprecation_errors=api.get("deprecationErrors"),
            )
        for unsupported in ("observeLogMessages", "storeEventsAsEntities", "autoEncryptOpts",
                            "observeTracingMessages", "awaitMinPoolSizeMS"):
            if unsupported in spec:
                raise NotImplementedError(f"client option {unsupported}")
        if self.runner.uses_fail_points and not any(
            k.lower() == "heartbeatfrequencyms" for k in kwargs
        ):
            # Allowed by the test format for clients that meet fail points: after an error that
            # marks the server Unknown, the client finds it again within this time.
            kwargs["heartbeatFrequencyMS"] = FAST_HEARTBEAT_MS
        client = MongoClient(self.runner.deployment.uri, **kwargs)
        self.runner.cleanups.append(client.close)
        return client

    def _create_database(self, spec: Mapping[str, Any]) -> Database:
        client = self.typed(spec["client"], MongoClient)
        options = collection_options(spec.get("databaseOptions") or {})
        return client.get_database(spec["databaseName"], **options)

    def _create_collection(self, spec: Mapping[str, Any]) -> Collection:
        db = self.typed(spec["database"], Database)
        options = collection_options(spec.get("collectionOptions") or {})
        return db.get_collection(spec["collectionName"], **options)

    def _create_session(self, spec: Mapping[str, Any]) -> ClientSession:
        client = self.typed(spec["client"], MongoClient)
        opts = dict(spec.get("sessionOptions") or {})
        kwargs: dict[str, Any] = {}
        if "causalConsistency" in opts:
            kwargs["causal_consistency"] = opts.pop("causalConsistency")
        if "snapshot" in opts:
            kwargs["snapshot"] = opts.pop("snapshot")
        if "defaultTransactionOptions" in opts:
            from pymongo.synchronous.client_session import TransactionOptions

            kwargs["default_transaction_options"] = TransactionOptions(
                **collection_options(opts.pop("defaultTransactionOptions"))
            )
        if opts:
            raise NotImplementedError(f"sessionOptions {sorted(opts)}")
        session = client.start_session(**kwargs)
        self.lsids[spec["id"]] = copy.deepcopy(session.session_id)
        self.runner.cleanups.append(session.end_session)
        return session


def collection_options(options: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key == "readConcern":
            out["read_concern"] = ReadConcern(**value)
        elif key == "writeConcern":
            out["write_concern"] = write_concern(value)
        elif key == "readPreference":
            out["read_preference"] = read_preference(value)
        elif key == "timeoutMS":
            raise NotImplementedError("timeoutMS as a database/collection option")
        else:
            raise NotImplementedError(f"collection/database option {key}")
    return out


def write_concern(value: Mapping[str, Any]) -> WriteConcern:
    kwargs = dict(value)
    if "journal" in kwargs:
        kwargs["j"] = kwargs.pop("journal")
    if "wtimeoutMS" in kwargs:
        kwargs["wtimeout"] = kwargs.pop("wtimeoutMS")
    return WriteConcern(**kwargs)


def read_preference(value: Mapping[str, Any]) -> Any:
    mode = read_pref_mode_from_name(value["mode"])
    from pymongo.read_preferences import make_read_preference

    return make_read_preference(
        mode, value.get("tagSets"), value.get("maxStalenessSeconds", -1)
    )


# -- results --------------------------------------------------------------------------------------


def as_document(name: str, result: Any) -> Any:
    """A driver result as the document the test format compares."""
    from pymongo.results import DeleteResult, InsertManyResult, InsertOneResult, UpdateResult

    if isinstance(result, InsertOneResult):
        return {"insertedId": result.inserted_id}
    if isinstance(result, InsertManyResult):
        return {"insertedIds": dict(enumerate(result.inserted_ids))}
    if isinstance(result, UpdateResult):
        return {
            "matchedCount": result.matched_count,
            "modifiedCount": result.modified_count,
            "upsertedCount": 0 if result.upserted_id is None else 1,
            "upsertedId": result.upserted_id,
        }
    if isinstance(result, DeleteResult):
        return {"deletedCount": result.deleted_count}
    if isinstance(result, BulkWriteResult):
        return {
            "deletedCount": result.deleted_count,
            "insertedCount": result.inserted_count,
            "matchedCount": result.matched_count,
            "modifiedCount": result.modified_count,
            "upsertedCount": result.upserted_count,
            "upsertedIds": {str(k): v for k, v in result.upserted_ids.items()},
        }
    return result


# -- operations -----------------------------------------------------------------------------------

_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def snake(name: str) -> str:
    special = {"maxAwaitTimeMS": "max_await_time_ms", "maxTimeMS": "max_time_ms"}
    return special.get(name) or _SNAKE.sub("_", name).lower()


# Arguments each operation accepts (camelCase as in the files), by operation name.
_WATCH_ARGS = {
    "pipeline", "fullDocument", "fullDocumentBeforeChange", "resumeAfter", "startAfter",
    "startAtOperationTime", "maxAwaitTimeMS", "batchSize", "collation", "comment",
    "showExpandedEvents", "session", "timeoutMS",
}


class Runner:
    """Runs one test of one file; `run` raises AssertionError on failure, SkipTest to skip."""

    def __init__(self, deployment: Deployment, internal: MongoClient) -> None:
        self.deployment = deployment
        self.internal = internal
        self.cleanups: list[Callable[[], Any]] = []
        self.fail_points: list[str] = []
        self.entities = EntityMap(self)
        self.matcher = Matcher(self.entities)
        self.uses_fail_points = False
        self.stream_timeouts: dict[int, float] = {}

    # -- the test ---------------------------------------------------------------------------

    def run(self, file_spec: Mapping[str, Any], test: Mapping[str, Any]) -> None:
        schema = version_tuple(file_spec["schemaVersion"])
        if schema[0] != SCHEMA_VERSION[0] or schema[:2] > SCHEMA_VERSION:
            raise AssertionError(f"unsupported schemaVersion {file_spec['schemaVersion']}")
        reason = self.deployment.unmet_all(file_spec.get("runOnRequirements"))
        reason = reason or self.deployment.unmet_all(test.get("runOnRequirements"))
        if reason:
            raise SkipTest(reason)
        if "skipReason" in test:
            raise SkipTest(test["skipReason"])
        self.uses_fail_points = any(
            op.get("name") in ("failPoint", "targetedFailPoint") for op in test["operations"]
        )
        try:
            self._run(file_spec, test)
        finally:
            self.close()

    def _run(self, file_spec: Mapping[str, Any], test: Mapping[str, Any]) -> None:
        with fast_heartbeats():
            self._kill_all_sessions()
            self._initial_data(file_spec.get("initialData") or [])
            self.entities.create(list(file_spec.get("createEntities") or []))
            for operation in test["operations"]:
                self.operation(operation)
            for recorder in self.entities.recorders.values():
                recorder.recording = False
            self._disable_fail_points()
            for expected in test.get("expectEvents") or []:
                self.check_events(expected)
            for data in test.get("outcome") or []:
                self.check_outcome(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._disable_fail_points()
        for entity in self.entities.entities.values():
            if isinstance(entity, (ChangeStream, CommandCursor, Cursor)):
                with contextlib.suppress(Exception):
                    entity.close()
        while self.cleanups:
            with contextlib.suppress(Exception):
                self.cleanups.pop()()

    def _kill_all_sessions(self) -> None:
        with contextlib.suppress(PyMongoError):
            self.internal.admin.command({"killAllSessions": []})

    def _initial_data(self, collections: list[Mapping[str, Any]]) -> None:
        majority = WriteConcern(w="majority")
        for data in collections:
            db = self.internal.get_database(data["databaseName"], write_concern=majority)
            name = data["collectionName"]
            for drop in (name, f"enxcol_.{name}.esc", f"enxcol_.{name}.ecoc"):
                db.drop_collection(drop)
            options = data.get("createOptions")
            if options is not None:
                if "writeConcern" in options:
                    raise AssertionError("initialData createOptions must not set writeConcern")
                db.create_collection(name, check_exists=False, **options)
            if data["documents"]:
                db[name].insert_many(list(data["documents"]))
            elif options is None:
                db.create_collection(name, check_exists=False)

    def _disable_fail_points(self) -> None:
        # Through the internal client (the same, single server): the test may have closed the
        # client that configured it.
        while self.fail_points:
            name = self.fail_points.pop()
            self.internal.admin.command({"configureFailPoint": name, "mode": "off"})

    # -- operations -------------------------------------------------------------------------

    def operation(self, op: Mapping[str, Any]) -> None:
        if op["object"] == "testRunner":
            method = getattr(self, f"_runner_{op['name']}", None)
            if method is None:
                raise NotImplementedError(f"testRunner operation {op['name']!r}")
            method(op.get("arguments") or {})
            return
        target = self.entities[op["object"]]
        arguments = dict(op.get("arguments") or {})
        expect_error = op.get("expectError")
        ignore = op.get("ignoreResultAndError", False)
        try:
            result = self.call(target, op["name"], arguments)
        except (SkipTest, NotImplementedError, AssertionError):
            raise
        except Exception as exc:
            if ignore and isinstance(exc, PyMongoError):
                return
            if expect_error is None:
                raise
            self.check_error(expect_error, exc, op)
            return
        if expect_error is not None:
            raise AssertionError(
                f"{op['name']} on {op['object']} succeeded with {result!r}; expected an error "
                f"{expect_error!r}"
            )
        if ignore:
            return
        if "expectResult" in op:
            actual = as_document(op["name"], result)
            root = op["name"] in ("iterateUntilDocumentOrError", "iterateOnce") or isinstance(
                actual, Mapping
            )
            if isinstance(actual, list) and op["name"] in _ROOT_ARRAY_OPS:
                expected = op["expectResult"]
                if not isinstance(expected, list) or len(expected) != len(actual):
                    raise AssertionError(f"expected {expected!r}, got {actual!r}")
                for e, a in zip(expected, actual):
                    self.matcher.match(e, a, root=True)
            else:
                self.matcher.match(op["expectResult"], actual, root=root)
        if "saveResultAsEntity" in op:
            self.entities[op["saveResultAsEntity"]] = result

    def call(self, target: Any, name: str, args: dict[str, Any]) -> Any:
        if isinstance(target, ChangeStream):
            kind = "change_stream"
        elif isinstance(target, MongoClient):
            kind = "client"
        elif isinstance(target, Database):
            kind = "database"
        elif isinstance(target, Collection):
            kind = "collection"
        elif isinstance(target, ClientSession):
            kind = "session"
        elif isinstance(target, (CommandCursor, Cursor)):
            kind = "cursor"
        else:
            raise NotImplementedError(f"operations on a {type(target).__name__}")
        method = getattr(self, f"_{kind}_{name}", None)
        if method is None and kind in ("client", "database", "collection"):
            method = getattr(self, f"_any_{name}", None)
        if method is None:
            raise NotImplementedError(f"{kind} operation {name!r}")
        if "session" in args:
            args["session"] = self.entities.typed(args["session"], ClientSession)
        if kind in ("database", "collection") and name != "runCommand":
            options = {k: args.pop(k) for k in ("readConcern", "writeConcern", "readPreference")
                       if k in args}
            if options:
                target = target.with_options(**collection_options(options))
        timeout_ms = args.pop("timeoutMS", None)
        if timeout_ms is None and kind == "change_stream":
            # pymongo's CSOT is `with pymongo.timeout(s)` around each call: a change stream
            # created with timeoutMS gets it around every iteration.
            timeout_ms = self.stream_timeouts.get(id(target))
        if timeout_ms is None:
            result = method(target, **args)
        else:
            with pymongo.timeout(timeout_ms / 1000 if timeout_ms else None):
                result = method(target, **args)
        if timeout_ms is not None and isinstance(result, ChangeStream):
            self.stream_timeouts[id(result)] = timeout_ms
        return result

    # change streams (client / database / collection)

    def _any_createChangeStream(self, target: Any, **args: Any) -> ChangeStream:
        unknown = set(args) - _WATCH_ARGS
        if unknown:
            raise NotImplementedError(f"createChangeStream arguments {sorted(unknown)}")
        kwargs = {snake(k): v for k, v in args.items() if k != "pipeline"}
        stream = target.watch(args.get("pipeline"), **kwargs)  # runs the aggregate
        self.cleanups.append(stream.close)
        return stream

    def _change_stream_iterateUntilDocumentOrError(self, stream: ChangeStream) -> Any:
        deadline = time.monotonic() + ITERATE_LIMIT_S
        while stream.alive:
            doc = stream.try_next()
            if doc is not None:
                return doc
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"iterateUntilDocumentOrError: no document or error in {ITERATE_LIMIT_S} s"
                )
        raise AssertionError("iterateUntilDocumentOrError: the change stream closed")

    def _change_stream_iterateOnce(self, stream: ChangeStream) -> Any:
        return stream.try_next()

    def _change_stream_close(self, stream: ChangeStream) -> None:
        with contextlib.suppress(PyMongoError):
            stream.close()

    def _cursor_iterateUntilDocumentOrError(self, cursor: Any) -> Any:
        deadline = time.monotonic() + ITERATE_LIMIT_S
        while cursor.alive:
            with contextlib.suppress(StopIteration):
                return next(cursor)
            if time.monotonic() > deadline:
                raise AssertionError("iterateUntilDocumentOrError: no document")
        raise AssertionError("iterateUntilDocumentOrError: the cursor is exhausted")

    def _cursor_iterateOnce(self, cursor: Any) -> Any:
        with contextlib.suppress(StopIteration):
            return next(cursor)
        return None

    def _cursor_close(self, cursor: Any) -> None:
        with contextlib.suppress(PyMongoError):
            cursor.close()

    # client

    def _client_listDatabases(self, client: MongoClient, **args: Any) -> list:
        return list(client.list_databases(**_snake_args(args)))

    def _client_listDatabaseNames(self, client: MongoClient, **args: Any) -> list:
        return client.list_database_names(**_snake_args(args))

    def _client_close(self, client: MongoClient) -> None:
        client.close()

    # database

    def _database_runCommand(
        self, db: Database, command: Mapping[str, Any], commandName: str,
        readPreference: Any = None, session: Any = None,
    ) -> Any:
        ordered = SON([(commandName, command[commandName])])
        ordered.update((k, v) for k, v in command.items() if k != commandName)
        kwargs: dict[str, Any] = {"session": session}
        if readPreference is not None:
            kwargs["read_preference"] = read_preference(readPreference)
        return db.command(ordered, **kwargs)

    def _database_createCollection(
        self, db: Database, collection: str, session: Any = None, **options: Any
    ) -> Collection:
        return db.create_collection(collection, session=session, check_exists=False, **options)

    def _database_dropCollection(
        self, db: Database, collection: str, session: Any = None, **options: Any
    ) -> Any:
        return db.drop_collection(collection, session=session, **_snake_args(options))

    def _database_modifyCollection(
        self, db: Database, collection: str, session: Any = None, **options: Any
    ) -> Any:
        # pymongo has no modifyCollection helper: the command it would send.
        return db.command(SON([("collMod", collection), *options.items()]), session=session)

    def _database_listCollections(self, db: Database, **args: Any) -> list:
        return list(db.list_collections(**_snake_args(args)))

    def _database_listCollectionNames(self, db: Database, **args: Any) -> list:
        return db.list_collection_names(**_snake_args(args))

    def _database_aggregate(self, db: Database, pipeline: list, **args: Any) -> list:
        return list(db.aggregate(pipeline, **_snake_args(args)))

    # collection

    def _collection_insertOne(self, coll: Collection, document: Any, **args: Any) -> Any:
        return coll.insert_one(document, **_snake_args(args))

    def _collection_insertMany(self, coll: Collection, documents: list, **args: Any) -> Any:
        return coll.insert_many(documents, **_snake_args(args))

    def _collection_updateOne(self, coll: Collection, filter: Any, update: Any, **args: Any):
        return coll.update_one(filter, update, **_snake_args(args))

    def _collection_updateMany(self, coll: Collection, filter: Any, update: Any, **args: Any):
        return coll.update_many(filter, update, **_snake_args(args))

    def _collection_replaceOne(
        self, coll: Collection, filter: Any, replacement: Any, **args: Any
    ) -> Any:
        return coll.replace_one(filter, replacement, **_snake_args(args))

    def _collection_deleteOne(self, coll: Collection, filter: Any, **args: Any) -> Any:
        return coll.delete_one(filter, **_snake_args(args))

    def _collection_deleteMany(self, coll: Collection, filter: Any, **args: Any) -> Any:
        return coll.delete_many(filter, **_snake_args(args))

    def _collection_find(self, coll: Collection, filter: Any = None, **args: Any) -> list:
        return list(coll.find(filter, **_snake_args(args)))

    def _collection_aggregate(self, coll: Collection, pipeline: list, **args: Any) -> list:
        return list(coll.aggregate(pipeline, **_snake_args(args)))

    def _collection_countDocuments(self, coll: Collection, filter: Any, **args: Any) -> int:
        return coll.count_documents(filter, **_snake_args(args))

    def _collection_estimatedDocumentCount(self, coll: Collection, **args: Any) -> int:
        return coll.estimated_document_count(**_snake_args(args))

    def _collection_distinct(
        self, coll: Collection, fieldName: str, filter: Any = None, **args: Any
    ) -> list:
        return coll.distinct(fieldName, filter, **_snake_args(args))

    def _collection_createIndex(self, coll: Collection, keys: Mapping, **args: Any) -> str:
        return coll.create_index(list(keys.items()), **_snake_args(args))

    def _collection_dropIndex(self, coll: Collection, name: str, **args: Any) -> Any:
        return coll.drop_index(name, **_snake_args(args))

    def _collection_listIndexes(self, coll: Collection, **args: Any) -> list:
        return list(coll.list_indexes(**_snake_args(args)))

    def _collection_drop(self, coll: Collection, **args: Any) -> Any:
        return coll.drop(**_snake_args(args))

    def _collection_rename(self, coll: Collection, to: str, **args: Any) -> Any:
        kwargs = {}
        if "dropTarget" in args:
            kwargs["dropTarget"] = args.pop("dropTarget")
        return coll.rename(to, **_snake_args(args), **kwargs)

    # testRunner operations

    def _runner_failPoint(self, args: Mapping[str, Any]) -> None:
        client = self.entities.typed(args["client"], MongoClient)
        command = SON(args["failPoint"].items())
        client.admin.command(command, read_preference=ReadPreference.PRIMARY)
        self.fail_points.append(command["configureFailPoint"])

    def _runner_createEntities(self, args: Mapping[str, Any]) -> None:
        self.entities.create(list(args["entities"]))

    def _runner_assertCollectionExists(self, args: Mapping[str, Any]) -> None:
        names = self.internal[args["databaseName"]].list_collection_names()
        if args["collectionName"] not in names:
            raise AssertionError(f"{args['collectionName']} not in {names}")

    def _runner_assertCollectionNotExists(self, args: Mapping[str, Any]) -> None:
        names = self.internal[args["databaseName"]].list_collection_names()
        if args["collectionName"] in names:
            raise AssertionError(f"{args['collectionName']} in {names}")

    def _runner_assertIndexExists(self, args: Mapping[str, Any]) -> None:
        coll = self.internal[args["databaseName"]][args["collectionName"]]
        names = [index["name"] for index in coll.list_indexes()]
        if args["indexName"] not in names:
            raise AssertionError(f"{args['indexName']} not in {names}")

    def _runner_assertIndexNotExists(self, args: Mapping[str, Any]) -> None:
        coll = self.internal[args["databaseName"]][args["collectionName"]]
        names = [index["name"] for index in coll.list_indexes()]
        if args["indexName"] in names:
            raise AssertionError(f"{args['indexName']} in {names}")

    def _runner_wait(self, args: Mapping[str, Any]) -> None:
        time.sleep(args["ms"] / 1000)

    # -- assertions -------------------------------------------------------------------------

    def check_error(self, expected: Mapping[str, Any], exc: BaseException, op: Any) -> None:
        details = getattr(exc, "details", None)
        details = details if isinstance(details, Mapping) else {}
        context = f"{op['name']} raised {type(exc).__name__}: {exc}"
        if not isinstance(exc, PyMongoError):
            raise AssertionError(f"{context}; not a driver error") from exc
        client_error = _is_client_error(exc)
        if "isClientError" in expected and expected["isClientError"] != client_error:
            raise AssertionError(f"{context}; isClientError is {client_error}") from exc
        if "isTimeoutError" in expected and expected["isTimeoutError"] != bool(exc.timeout):
            raise AssertionError(f"{context}; isTimeoutError is {bool(exc.timeout)}") from exc
        if "errorContains" in expected and expected["errorContains"].lower() not in str(
            exc
        ).lower():
            raise AssertionError(f"{context}; no {expected['errorContains']!r} in it") from exc
        if "errorCode" in expected and details.get("code") != expected["errorCode"]:
            raise AssertionError(
                f"{context}; code {details.get('code')}, expected {expected['errorCode']}"
            ) from exc
        if "errorCodeName" in expected and str(details.get("codeName", "")).lower() != expected[
            "errorCodeName"
        ].lower():
            raise AssertionError(
                f"{context}; codeName {details.get('codeName')}, expected "
                f"{expected['errorCodeName']}"
            ) from exc
        for label in expected.get("errorLabelsContain") or []:
            if not exc.has_error_label(label):
                raise AssertionError(f"{context}; no error label {label}") from exc
        for label in expected.get("errorLabelsOmit") or []:
            if exc.has_error_label(label):
                raise AssertionError(f"{context}; unexpected error label {label}") from exc
        if "errorResponse" in expected:
            self.matcher.match(expected["errorResponse"], details, root=True)
        if "expectResult" in expected:
            if not isinstance(exc, BulkWriteError):
                raise AssertionError(f"{context}; expectResult needs a bulk write error")
            self.matcher.match(expected["expectResult"], exc.details, root=True)

    def check_events(self, expected: Mapping[str, Any]) -> None:
        event_type = expected.get("eventType", "command")
        if event_type != "command":
            raise NotImplementedError(f"expectEvents eventType {event_type}")
        recorder = self.entities.recorders.get(expected["client"])
        if recorder is None:
            raise AssertionError(f"{expected['client']} is not a client entity")
        actual = recorder.events
        wanted = expected["events"]
        if expected.get("ignoreExtraEvents"):
            actual = actual[: len(wanted)]
        shown = "\n".join(f"  {kind} {_event_summary(e)}" for kind, e in recorder.events)
        if len(actual) != len(wanted):
            raise AssertionError(
                f"expected {len(wanted)} events for {expected['client']}, got "
                f"{len(actual)}:\n{shown}"
            )
        for i, (want, (kind, event)) in enumerate(zip(wanted, actual)):
            (want_kind, fields), = want.items()
            try:
                if want_kind != kind:
                    raise AssertionError(f"expected a {want_kind}, got a {kind}")
                self._match_event(fields, event)
            except AssertionError as exc:
                raise AssertionError(f"event {i}: {exc}\nactual events:\n{shown}") from None

    def _match_event(self, fields: Mapping[str, Any], event: Any) -> None:
        for key, value in fields.items():
            if key == "command":
                self.matcher.match(value, event.command, root=True, path="command")
            elif key == "reply":
                self.matcher.match(value, event.reply, root=True, path="reply")
            elif key == "commandName":
                if event.command_name != value:
                    raise AssertionError(f"commandName {event.command_name}, expected {value}")
            elif key == "databaseName":
                if event.database_name != value:
                    raise AssertionError(f"databaseName {event.database_name}, expected {value}")
            elif key == "hasServiceId":
                if (event.service_id is not None) != value:
                    raise AssertionError(f"hasServiceId is {event.service_id is not None}")
            elif key == "hasServerConnectionId":
                if (event.server_connection_id is not None) != value:
                    raise AssertionError(
                        f"hasServerConnectionId is {event.server_connection_id is not None}"
                    )
            else:
                raise NotImplementedError(f"command event field {key}")

    def check_outcome(self, data: Mapping[str, Any]) -> None:
        coll = self.internal[data["databaseName"]].get_collection(
            data["collectionName"], read_preference=ReadPreference.PRIMARY,
            read_concern=ReadConcern("local"),
        )
        actual = list(coll.find({}, sort=[("_id", 1)]))
        expected = list(data["documents"])
        if [_normal(d) for d in actual] != [_normal(d) for d in expected]:
            raise AssertionError(f"outcome of {coll.full_name}: {actual!r}, expected {expected!r}")


_ROOT_ARRAY_OPS = frozenset(
    {"find", "aggregate", "listCollections", "listDatabases", "listIndexes", "runCursorCommand"}
)


def _snake_args(args: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in args.items():
        if key in ("session",):
            out[key] = value
        elif key == "let":
            out["let"] = value
        else:
            out[snake(key)] = value
    return out


def _is_client_error(exc: PyMongoError) -> bool:
    """Not derived from a server response (network errors included)."""
    if isinstance(exc, ConnectionFailure):
        return not isinstance(exc, NotPrimaryError)
    return isinstance(exc, (InvalidOperation, ConfigurationError)) or not isinstance(
        exc, (OperationFailure, NotPrimaryError)
    )


def _normal(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value


def _event_summary(event: Any) -> str:
    command = getattr(event, "command", None)
    if command is not None:
        return f"{event.command_name} {event.database_name} {dict(command)!r}"
    return f"{event.command_name} {getattr(event, 'reply', getattr(event, 'failure', ''))!r}"


@contextlib.contextmanager
def fast_heartbeats(seconds: float = 0.05) -> Iterator[None]:
    """pymongo's minimum heartbeat interval, reduced (the test format allows it for clients
    that meet fail points): after a network error a client rediscovers the server at once."""
    from pymongo import common

    before = common.MIN_HEARTBEAT_INTERVAL
    common.MIN_HEARTBEAT_INTERVAL = seconds
    try:
        yield
    finally:
        common.MIN_HEARTBEAT_INTERVAL = before
