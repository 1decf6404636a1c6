"""Authentication (SCRAM-SHA-1, SCRAM-SHA-256) and authorization by roles, as mongod does them.

No I/O here: `cdcserver/commands/auth.py` runs these from the wire commands, and
`cdcserver hash-password` derives the stored credentials.

SCRAM (RFC 5802 / 7677), server side, with mongod's details:

* SCRAM-SHA-1's password is MongoDB's password digest, `md5("user:mongo:password")` in hex;
  SCRAM-SHA-256's is the SASLprep'd password. Salts are hash length - 4 bytes (16 and 28).
* The server nonce is the client's followed by the base64 of 24 random bytes.
* After `v=ServerSignature` the conversation is not done: mongod waits for one more, empty,
  round unless saslStart asked for `options: {skipEmptyExchange: true}`.
* Every failure inside a step is reported to the client as 18 "Authentication failed." (the
  detail is only logged); an unknown mechanism is 334 before any step runs.

Authorization follows MongoDB's built-in roles over a small set of action types: a
requirement is (resource, actions); a role grants actions on a resource pattern.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from bson.raw_bson import RawBSONDocument

from cdcserver.config import AuthConfig, ScramCredentials
from cdcserver.roles import Grant, Resource, role_grants
from cdcserver.roles import parse_role as parse_role  # this module's API (cli.py's add-user)
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import bson_obj_string

SCRAM_SHA_1 = "SCRAM-SHA-1"
SCRAM_SHA_256 = "SCRAM-SHA-256"
MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_1)
# mongod's scramIterationCount / scramSHA256IterationCount defaults.
DEFAULT_ITERATIONS = {SCRAM_SHA_1: 10_000, SCRAM_SHA_256: 15_000}
_HASHES = {SCRAM_SHA_1: "sha1", SCRAM_SHA_256: "sha256"}

AUTHENTICATION_FAILED = "Authentication failed."


class AuthError(MongoError):
    """An authentication error (17 ProtocolError, 18 AuthenticationFailed, 334...)."""


def authentication_failed() -> AuthError:
    return AuthError(18, AUTHENTICATION_FAILED)


# -- credentials -------------------------------------------------------------------------------


def mongo_password_digest(user: str, password: str) -> str:
    """MongoDB's password digest: SCRAM-SHA-1's password (and MONGODB-CR's, once)."""
    return hashlib.md5(f"{user}:mongo:{password}".encode()).hexdigest()  # noqa: S324


def scram_password(mechanism: str, user: str, password: str) -> bytes:
    if mechanism == SCRAM_SHA_1:
        return mongo_password_digest(user, password).encode()
    from pymongo.saslprep import saslprep  # RFC 4013, as drivers and mongod apply it

    prepped: str = saslprep(password)  # pymongo types its result as Any
    return prepped.encode("utf-8")


def _hmac(mechanism: str, key: bytes, msg: bytes) -> bytes:
    return hmac.digest(key, msg, _HASHES[mechanism])


def _h(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(_HASHES[mechanism], data).digest()


def derive_credentials(
    mechanism: str,
    user: str,
    password: str,
    *,
    salt: bytes | None = None,
    iterations: int | None = None,
) -> ScramCredentials:
    """The stored credentials mongod keeps for a user (`db.system.users` `credentials`)."""
    if mechanism not in _HASHES:
        raise ValueError(f"unknown mechanism {mechanism!r}")
    iterations = iterations or DEFAULT_ITERATIONS[mechanism]
    if salt is None:
        salt = os.urandom(hashlib.new(_HASHES[mechanism]).digest_size - 4)
    salted = hashlib.pbkdf2_hmac(
        _HASHES[mechanism], scram_password(mechanism, user, password), salt, iterations
    )
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredentials(
        iteration_count=iterations,
        salt=base64.b64encode(salt).decode(),
        stored_key=base64.b64encode(_h(mechanism, client_key)).decode(),
        server_key=base64.b64encode(_hmac(mechanism, salted, b"Server Key")).decode(),
    )


# -- roles and privileges: cdcserver/roles.py ----------------------------------------------------


@dataclass(frozen=True)
class User:
    name: str
    db: str
    roles: tuple[tuple[str, str], ...]
    credentials: Mapping[str, ScramCredentials]
    grants: tuple[Grant, ...]

    @property
    def full_name(self) -> str:
        return f"{self.name}@{self.db}"

    def is_authorized(self, resource: Resource, actions: Iterable[str]) -> bool:
        return all(any(g.covers(resource, a) for g in self.grants) for a in actions)

    def has_any_privilege_on(self, db: str) -> bool:
        return any(
            g.kind == "anyResource" or (g.kind == "any" and db not in ("local", "config"))
            or (g.kind == "db" and g.db == db)
            for g in self.grants
        )


# mongod's internal user: what members of a cluster authenticate as to each other (keyFile /
# x.509 membership auth). The embedded cluster's front reaches its shards in-process as it.
SYSTEM_USER = User("__system", "local", (("__system", "admin"),), {},
                   (Grant("anyResource", "", frozenset()),))


class UserRegistry:
    """The users of `[auth]`, checked once at start (unknown roles, bad credentials)."""

    def __init__(self, config: AuthConfig) -> None:
        unknown = [m for m in config.mechanisms if m not in MECHANISMS]
        if unknown:
            raise ValueError(f"auth.mechanisms: unsupported {unknown} (supported: {MECHANISMS})")
        self.mechanisms = tuple(config.mechanisms)
        self.users: dict[tuple[str, str], User] = {}
        for i, uc in enumerate(config.users):
            where = f"auth.users[{i}] ({uc.user}@{uc.db})"
            creds: dict[str, ScramCredentials] = {}
            for mech, c in ((SCRAM_SHA_256, uc.scram_sha_256), (SCRAM_SHA_1, uc.scram_sha_1)):
                if c is None:
                    continue
                try:
                    salt, stored, server = (
                        base64.b64decode(x, validate=True) for x in (c.salt, c.stored_key,
                                                                     c.server_key)
                    )
                except ValueError:
                    raise ValueError(f"{where}: {mech} credentials are not base64") from None
                size = hashlib.new(_HASHES[mech]).digest_size
                if len(stored) != size or len(server) != size or not salt:
                    raise ValueError(f"{where}: {mech} keys must be {size} bytes")
                if c.iteration_count < 4096:
                    raise ValueError(f"{where}: {mech} iteration_count must be >= 4096")
                creds[mech] = c
            if not creds:
                raise ValueError(f"{where}: no scram_sha_256 or scram_sha_1 credentials")
            grants: list[Grant] = []
            for r in uc.roles:
                try:
                    grants.extend(role_grants(r.role, r.db))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
            self.users[(uc.user, uc.db)] = User(
                uc.user, uc.db, tuple((r.role, r.db) for r in uc.roles), creds, tuple(grants)
            )

    def find(self, name: str, db: str) -> User | None:
        return self.users.get((name, db))

    def mechanisms_for(self, user: User) -> list[str]:
        """hello's saslSupportedMechs: enabled mechanisms the user has credentials for."""
        return [m for m in MECHANISMS if m in self.mechanisms and m in user.credentials]


# -- the SCRAM conversation --------------------------------------------------------------------


class _StepFailed(Exception):
    """Why a step failed (logged; the client only learns "Authentication failed.")."""


def _decode_username(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramConversation:
    """One saslStart/saslContinue conversation: `step(payload) -> (done, payload)`.

    A failed step raises `AuthError` 18; the reason is kept in `failure` for the log.
    """

    def __init__(
        self, mechanism: str, db: str, users: UserRegistry, *, skip_empty_exchange: bool = False
    ) -> None:
        self.mechanism = mechanism
        self.db = db
        self.users = users
        self.skip_empty_exchange = skip_empty_exchange
        self.step_count = 0
        self.user_name = ""
        self.user: User | None = None  # set once the conversation succeeded
        self.done = False
        self.failure: str | None = None
        self._nonce = ""
        self._auth_message = ""
        self._credentials: ScramCredentials | None = None
        self._candidate: User | None = None

    def step(self, payload: bytes) -> tuple[bool, bytes]:
        self.step_count += 1
        try:
            if self.step_count == 1:
                return False, self._first(payload)
            if self.step_count == 2:
                final = self._second(payload)
                if self.skip_empty_exchange:
                    self.done = True
                return self.done, final
            if self.step_count == 3 and self._credentials is not None and not self.done:
                self.done = True
                return True, b""
            raise _StepFailed(f"Invalid SCRAM authentication step: {self.step_count}")
        except (_StepFailed, UnicodeDecodeError, ValueError) as exc:
            self.failure = str(exc)
            self.user = None
            raise authentication_failed() from None

    def _first(self, payload: bytes) -> bytes:
        text = payload.decode("utf-8")
        head, sep, rest = text.partition(",")
        if not sep:
            raise _StepFailed("Incorrect number of arguments for first SCRAM client message, "
                              "got 1 expected at least 3")
        if head.startswith("p="):
            raise _StepFailed("Server does not support channel binding")
        if head not in ("y", "n"):
            raise _StepFailed(f"Incorrect SCRAM client message prefix: {head}")
        authzid, sep, bare = rest.partition(",")
        if not sep:
            raise _StepFailed("Incorrect number of arguments for first SCRAM client message, "
                              "got 2 expected at least 3")
        if authzid and not authzid.startswith("a="):
            raise _StepFailed(f"Incorrect SCRAM authzid: {authzid}")
        if bare.startswith("m="):
            raise _StepFailed("SCRAM mandatory extensions are not supported")
        parts = [p for p in bare.split(",") if p]
        if len(parts) < 2:
            raise _StepFailed("Incorrect number of arguments for first SCRAM client message")
        if not parts[0].startswith("n=") or len(parts[0]) < 3:
            raise _StepFailed(f"Invalid SCRAM user name: {parts[0]}")
        self.user_name = _decode_username(parts[0][2:])
        if authzid and authzid[2:] != self.user_name:
            raise _StepFailed(f"SCRAM user name {self.user_name} does not match authzid")
        if not parts[1].startswith("r=") or len(parts[1]) < 6:
            raise _StepFailed(f"Invalid SCRAM client nonce: {parts[1]}")
        if self.mechanism not in self.users.mechanisms:
            raise _StepFailed(f"{self.mechanism} authentication is disabled")
        user = self.users.find(self.user_name, self.db)
        if user is None:
            raise _StepFailed(f"Could not find user \"{self.user_name}\" for db \"{self.db}\"")
        creds = user.credentials.get(self.mechanism)
        if creds is None:
            raise _StepFailed(f"Unable to use {self.mechanism} based authentication for user "
                              f"without any {self.mechanism} credentials registered")
        self._candidate = user
        self._credentials = creds
        self._nonce = parts[1][2:] + base64.b64encode(os.urandom(24)).decode()
        server_first = f"r={self._nonce},s={creds.salt},i={creds.iteration_count}"
        self._auth_message = f"{bare},{server_first}"
        return server_first.encode()

    def _second(self, payload: bytes) -> bytes:
        text = payload.decode("utf-8")
        without_proof, sep, last = text.rpartition(",")
        if not sep:
            raise _StepFailed("Incorrect number of arguments for second SCRAM client message")
        if len(last) < 3 or not last.startswith("p="):
            raise _StepFailed(f"Incorrect SCRAM ClientProof: {last}")
        parts = [p for p in without_proof.split(",") if p]
        if len(parts) < 2:
            raise _StepFailed("Incorrect number of arguments for second SCRAM client message")
        if not parts[0].startswith("c=") or len(parts[0]) < 3:
            raise _StepFailed(f"Incorrect SCRAM channel binding: {parts[0]}")
        if not parts[1].startswith("r=") or parts[1][2:] != self._nonce:
            raise _StepFailed("Unmatched SCRAM nonce received from client in second step")
        creds = self._credentials
        assert creds is not None
        auth_message = f"{self._auth_message},{without_proof}".encode()
        stored_key = base64.b64decode(creds.stored_key)
        proof = base64.b64decode(last[2:], validate=True)
        signature = _hmac(self.mechanism, stored_key, auth_message)
        if len(proof) != len(signature):
            raise _StepFailed("SCRAM authentication failed, storedKey mismatch")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(_h(self.mechanism, client_key), stored_key):
            raise _StepFailed("SCRAM authentication failed, storedKey mismatch")
        self.user = self._candidate
        server_signature = _hmac(self.mechanism, base64.b64decode(creds.server_key), auth_message)
        return b"v=" + base64.b64encode(server_signature)


# -- logical sessions --------------------------------------------------------------------------

# The `uid` mongod puts in a logical session id (getLogicalSessionUserDigestForLoggedInUser):
# SHA-256 of the authenticated user's "user@db", of "" without authentication.
NO_AUTH_DIGEST = hashlib.sha256(b"").digest()
# The digest of the user running the current command: set by ServerAuth.check before each
# command (the connection's task carries it), read where the command checks out its session.
SESSION_USER_DIGEST: ContextVar[bytes] = ContextVar("session_user_digest", default=NO_AUTH_DIGEST)


def user_digest(user: User) -> bytes:
    return hashlib.sha256(user.full_name.encode()).digest()


def user_name_digest(name: str, db: str) -> bytes:
    return hashlib.sha256(f"{name}@{db}".encode()).digest()


# -- which command needs what ------------------------------------------------------------------

# Commands whose requiresAuth() is false in mongod: they run before authentication.
NO_AUTH_COMMANDS = frozenset(
    {"hello", "isMaster", "ismaster", "saslStart", "saslContinue", "authenticate", "logout",
     "ping", "buildInfo", "buildinfo", "connectionStatus", "listCommands"}
)
# Commands any authenticated user may run (no privileges of their own in mongod).
ANY_USER_COMMANDS = frozenset(
    {"endSessions", "killSessions", "refreshSessions", "startSession", "whatsmyuri",
     "commitTransaction", "abortTransaction", "getLastError", "listDatabases", "hostInfo",
     "getMore", "killCursors"}
)
_COLLECTION_ACTIONS: dict[str, tuple[str, ...]] = {
    "find": ("find",),
    "count": ("find",),
    "distinct": ("find",),
    "listIndexes": ("listIndexes",),
    "insert": ("insert",),
    "update": ("update",),
    "delete": ("remove",),
    "create": ("createCollection",),
    "drop": ("dropCollection",),
    "createIndexes": ("createIndex",),
    "dropIndexes": ("dropIndex",),
    "deleteIndexes": ("dropIndex",),
    "collMod": ("collMod",),
    "collStats": ("collStats",),
    "collstats": ("collStats",),  # the alias, one command in mongod
    "validate": ("validate",),
    # search_index_commands.cpp: each on its namespace, with its own action
    "createSearchIndexes": ("createSearchIndexes",),
    "updateSearchIndex": ("updateSearchIndex",),
    "dropSearchIndex": ("dropSearchIndex",),
    "listSearchIndexes": ("listSearchIndexes",),
}
_DB_ACTIONS: dict[str, tuple[str, ...]] = {
    "listCollections": ("listCollections",),
    "dropDatabase": ("dropDatabase",),
    "dbStats": ("dbStats",),
    "dbstats": ("dbStats",),  # the alias, one command in mongod
    "dbHash": ("dbHash",),
}
_CLUSTER_ACTIONS: dict[str, tuple[str, ...]] = {
    "serverStatus": ("serverStatus",),
    "getParameter": ("getParameter",),
    "setParameter": ("setParameter",),
    "configureFailPoint": ("configureFailPoint",),
    "killOp": ("killop",),
    "top": ("top",),
    "getCmdLineOpts": ("getCmdLineOpts",),
    "replSetGetStatus": ("replSetGetStatus",),
    "connPoolStats": ("connPoolStats",),
    "killAllSessions": ("killAnySession",),
    "killAllSessionsByPattern": ("killAnySession",),
}
_WRITE_STAGES = ("$out", "$merge")
_READ_STAGES = ("$lookup", "$graphLookup", "$unionWith")

Requirement = tuple[Resource, tuple[str, ...]]


def _ns(db: str, coll: Any) -> Resource:
    return ("ns", db, coll if isinstance(coll, str) else "")


def _stage_target(db: str, spec: Any, key: str) -> Resource | None:
    if isinstance(spec, str):
        return _ns(db, spec)
    if isinstance(spec, Mapping):
        target = spec.get(key)
        if isinstance(target, str):
            spec_db = spec.get("db")
            return _ns(spec_db if isinstance(spec_db, str) else db, target)
        if isinstance(target, Mapping) and isinstance(target.get("coll"), str):
            tdb = target.get("db")
            return _ns(tdb if isinstance(tdb, str) else db, target["coll"])
    return None


def true_value(value: Any) -> bool:
    """BSONElement::trueValue: false for a missing field, false, 0, null."""
    return value is not None and value is not False and not (
        isinstance(value, (int, float)) and value == 0)


_LIST_SESSIONS: Requirement = (("cluster",), ("listSessions",))
_INPROG: Requirement = (("cluster",), ("inprog",))


def _source_requirements(stage: str, spec: Any, caller: str | None) -> list[Requirement]:
    """The privileges of an initial source that reads no collection: $currentOp needs inprog
    to show other users' operations (allUsers: true); $listLocalSessions / $listSessions need
    listSessions to list other users' sessions (allUsers, or `users` naming anyone else). A
    malformed spec needs nothing here: the stage's own parse error answers, as mongod's lite
    parse answers before its authorization check."""
    if not isinstance(spec, Mapping):
        return []
    if stage == "$currentOp":
        return [_INPROG] if spec.get("allUsers") is True else []
    if spec.get("allUsers") is True:
        return [_LIST_SESSIONS]
    users = spec.get("users")
    if isinstance(users, list) and any(
        not isinstance(u, Mapping) or f"{u.get('user')}@{u.get('db')}" != (caller or "@")
        for u in users
    ):
        return [_LIST_SESSIONS]
    return []


_PRIVILEGED_SOURCES = ("$currentOp", "$listLocalSessions", "$listSessions")
# Initial sources whose privilege is an action on the database, not find on the collection
# (LiteParsedListSearchIndexes::requiredPrivileges, isInitialSource).
_DB_ACTION_SOURCES = {"$listSearchIndexes": "listSearchIndexes"}


def _aggregate_requirements(
    cmd: Mapping[str, Any], db: str, caller: str | None = None
) -> list[Requirement]:
    pipeline = cmd.get("pipeline")
    stages = [s for s in pipeline if isinstance(s, Mapping)] if isinstance(pipeline, list) else []
    coll = cmd.get("aggregate")
    first = next(iter(stages[0]), "") if stages else ""
    if first in _PRIVILEGED_SOURCES:
        # initial sources: no find on the namespace (getPrivilegesForAggregate)
        reqs: list[Requirement] = _source_requirements(first, stages[0][first], caller)
        stages = stages[1:]
    elif first in _DB_ACTION_SOURCES:
        reqs = []  # an initial source: no find (its action: the loop below)
    elif first == "$changeStream":
        spec = stages[0]["$changeStream"]
        if db == "admin" and isinstance(spec, Mapping) and spec.get("allChangesForCluster"):
            resource: Resource = ("any",)
        elif isinstance(coll, str):
            resource = _ns(db, coll)
        else:
            resource = ("db", db)
        reqs = [(resource, ("find", "changeStream"))]
    elif isinstance(coll, str):
        reqs = [(_ns(db, coll), ("find",))]
    else:
        reqs = [(("db", db), ("find",))]  # collectionless ($documents...)
    for stage in stages[1:] if first == "$changeStream" else stages:
        name = next(iter(stage), "")
        if name in _WRITE_STAGES:
            key = "into" if name == "$merge" else "coll"
            target = _stage_target(db, stage[name], key)
            if target is not None:
                reqs.append((target, ("insert", "remove", "update")))
        elif name in _READ_STAGES:
            key = "coll" if name == "$unionWith" else "from"
            target = _stage_target(db, stage[name], key)
            if target is not None:
                reqs.append((target, ("find",)))
        elif name in _DB_ACTION_SOURCES:
            reqs.append((("db", db), (_DB_ACTION_SOURCES[name],)))
    return reqs


def _profile_requirements(cmd: Mapping[str, Any], db: str) -> list[Requirement]:
    """ProfileCmdBase::checkAuthForOperation: reading the settings (a level < 0 changing
    neither slowms nor sampleRate) needs find on <db>.system.profile or enableProfiler; any
    change needs enableProfiler on the database."""
    level = cmd.get("profile")
    if isinstance(level, bool) or not isinstance(level, (int, float)):
        return []  # the command's parse error (14) answers first, as mongod's does
    reading = (isinstance(level, (int, float)) and not isinstance(level, bool) and level < 0
               and "slowms" not in cmd and "sampleRate" not in cmd)
    return [(("db", db), ("enableProfiler",))] if not reading else [
        (_ns(db, "system.profile"), ("find",))]


def required_privileges(
    name: str, cmd: Mapping[str, Any], db: str, caller: str | None = None
) -> list[Requirement] | None:
    """What `cmd` needs beyond authentication; None: a command cdcserver does not know
    (forwarded with `--upstream`), which only `root` may run. `caller`: the running user's
    "user@db" (listing one's own sessions needs no privilege)."""
    if name in ANY_USER_COMMANDS:
        return []
    if name == "aggregate":
        return _aggregate_requirements(cmd, db, caller)
    if name == "currentOp":
        # CurrentOpCommand::checkAuthForOperation: inprog, or `$ownOps` for one's own
        return [] if true_value(cmd.get("$ownOps")) else [_INPROG]
    if name == "profile":
        return _profile_requirements(cmd, db)
    if name in _COLLECTION_ACTIONS:
        return [(_ns(db, cmd.get(name)), _COLLECTION_ACTIONS[name])]
    if name in ("findAndModify", "findandmodify"):
        actions = ["find", "update"]
        if cmd.get("remove"):
            actions = ["find", "remove"]
        elif cmd.get("upsert"):
            actions.append("insert")
        return [(_ns(db, cmd.get(name)), tuple(actions))]
    if name in _DB_ACTIONS:
        return [(("db", db), _DB_ACTIONS[name])]
    if name in _CLUSTER_ACTIONS:
        return [(("cluster",), _CLUSTER_ACTIONS[name])]
    if name == "renameCollection":
        source, target = cmd.get(name), cmd.get("to")
        if not isinstance(source, str) or not isinstance(target, str):
            return []  # the command's own argument checks answer
        sdb, _, scoll = source.partition(".")
        tdb, _, tcoll = target.partition(".")
        if sdb == tdb:
            return [(("db", sdb), ("renameCollectionSameDB",))]
        return [(_ns(sdb, scoll), ("find", "dropCollection")),
                (_ns(tdb, tcoll), ("insert", "createIndex"))]
    return None


def is_authorized(users: Sequence[User], requirements: list[Requirement] | None) -> bool:
    if requirements is None:
        return any(g.kind == "anyResource" for u in users for g in u.grants)
    return all(any(u.is_authorized(r, a) for u in users) for r, a in requirements)


# -- mongod's BSONObj::toString, quoted in "not authorized" messages ---------------------------


def unauthenticated(name: str) -> AuthError:
    return AuthError(13, f"Command {name} requires authentication")


def unauthorized(db: str, cmd: Mapping[str, Any]) -> AuthError:
    return AuthError(13, f"not authorized on {db} to execute command {bson_obj_string(cmd)}")


@dataclass
class ConnectionAuth:
    """A connection's authentication: its user (mongod 6.0+: one per connection) and the
    SASL conversation under way."""

    users: list[User] = field(default_factory=list)
    conversation: ScramConversation | None = None
    speculative: bool = False  # the last conversation began in hello (for tests and logs)
    last_mechanism: str = ""


class ServerAuth:
    """The server's side: its users, whether commands are checked, and who owns each cursor
    (only the user who opened a cursor may getMore or kill it)."""

    def __init__(self, config: AuthConfig) -> None:
        self.enabled = config.enabled
        self.registry = UserRegistry(config)
        self.cursor_owners: dict[int, frozenset[str]] = {}
        self._prune_at = 1024

    @staticmethod
    def of(conn: Any) -> ConnectionAuth:
        if conn.auth is None:
            conn.auth = ConnectionAuth()
        state: ConnectionAuth = conn.auth
        return state

    def check(self, conn: Any, name: str, cmd: Mapping[str, Any], db: str) -> None:
        """Raise mongod's 13 when `conn` may not run `cmd` (authentication on)."""
        if not self.enabled or name in NO_AUTH_COMMANDS:
            return
        users = self.of(conn).users
        if not users:
            raise unauthenticated(name)
        SESSION_USER_DIGEST.set(user_digest(users[0]))
        lsid = cmd.get("lsid")
        if isinstance(lsid, Mapping) and "uid" in lsid and lsid["uid"] != user_digest(
            users[0]
        ) and not is_authorized(
            users, [(("cluster",), ("impersonate",))]
        ):  # initializeOperationSessionInfo: only an impersonator may name another user
            raise AuthError(13, "Unauthorized to set user digest in LogicalSessionId")
        required = required_privileges(name, cmd, db, users[0].full_name)
        if name == "profile" and required and not is_authorized(users, required):
            required = [(("db", db), ("enableProfiler",))]  # enableProfiler reads them too
        if is_authorized(users, required):
            if name == "getMore":
                cursor_id = cmd.get("getMore")
                if isinstance(cursor_id, int) and not self._owns(users, cursor_id):
                    raise AuthError(
                        13, f"cursor id {cursor_id} was not created by the authenticated user"
                    )
            elif name == "killCursors":
                ids = cmd.get("cursors")
                # checkAuthForKillCursors: killAnyCursor on the cluster or the namespace
                any_cursor = is_authorized(users, [(("cluster",), ("killAnyCursor",))]) or \
                    is_authorized(users, [(_ns(db, cmd.get("killCursors")), ("killAnyCursor",))])
                if isinstance(ids, list) and not any_cursor and not all(
                    self._owns(users, i) for i in ids if isinstance(i, int)
                ):
                    raise unauthorized(db, cmd)
            return
        raise unauthorized(db, cmd)

    def _owns(self, users: Sequence[User], cursor_id: int) -> bool:
        owners = self.cursor_owners.get(int(cursor_id))
        if owners is None:
            return True  # no such cursor: the command's own CursorNotFound answers
        return any(u.full_name in owners for u in users)

    def after_command(
        self, conn: Any, name: str, cmd: Mapping[str, Any], reply: Any, live_ids: Any = None
    ) -> Any:
        """The reply as the user may see it (listDatabases: their databases only); notes the
        owner of a cursor the reply opened and forgets cursors that closed."""
        if name == "listDatabases" and self.enabled:
            return self._filter_databases(conn, reply)
        cursor = reply.get("cursor") if "cursor" in reply else None
        cursor_id = cursor.get("id") if isinstance(cursor, Mapping) else None
        if name == "getMore":
            if cursor_id == 0:
                self.cursor_owners.pop(cmd.get("getMore"), None)  # type: ignore[arg-type]
            return reply
        if name == "killCursors":
            for i in cmd.get("cursors") or []:
                if isinstance(i, int):
                    self.cursor_owners.pop(i, None)
            return reply
        if not isinstance(cursor_id, int) or not cursor_id:
            return reply
        users = conn.auth.users if conn.auth is not None else []
        self.cursor_owners[int(cursor_id)] = frozenset(u.full_name for u in users)
        if len(self.cursor_owners) > self._prune_at and live_ids is not None:
            live = live_ids()
            for i in [i for i in self.cursor_owners if i not in live]:
                del self.cursor_owners[i]
            self._prune_at = max(1024, 2 * len(self.cursor_owners))
        return reply

    def _filter_databases(self, conn: Any, reply: Any) -> Any:
        """Without the listDatabases action a user sees only the databases they have
        privileges on (mongod's authorizedDatabases default)."""
        users = self.of(conn).users
        if is_authorized(users, [(("cluster",), ("listDatabases",))]):
            return reply
        raw = isinstance(reply, RawBSONDocument)
        out = bson_bytes.decode(reply.raw) if raw else reply
        dbs = out.get("databases")
        if isinstance(dbs, list):
            out["databases"] = [
                d for d in dbs if isinstance(d, Mapping)
                and any(u.has_any_privilege_on(str(d.get("name"))) for u in users)
            ]
        return RawBSONDocument(bson_bytes.encode(out), bson_bytes.RAW) if raw else out


def user_toml(
    user: str,
    db: str,
    roles: Sequence[tuple[str, str]],
    password: str,
    *,
    iterations: Mapping[str, int] | None = None,
) -> str:
    """The `[[auth.users]]` block `cdcserver hash-password` prints: stored credentials for
    both mechanisms, never the password."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["[[auth.users]]", f"user = {q(user)}", f"db = {q(db)}"]
    lines.append(
        "roles = [" + ", ".join(f"{{ role = {q(r)}, db = {q(d)} }}" for r, d in roles) + "]"
    )
    for mech, key in ((SCRAM_SHA_256, "scram_sha_256"), (SCRAM_SHA_1, "scram_sha_1")):
        count = (iterations or {}).get(mech)
        c = derive_credentials(mech, user, password, iterations=count)
        lines += [
            f"[auth.users.{key}]",
            f"iteration_count = {c.iteration_count}",
            f"salt = {q(c.salt)}",
            f"stored_key = {q(c.stored_key)}",
            f"server_key = {q(c.server_key)}",
        ]
    return "\n".join(lines) + "\n"
