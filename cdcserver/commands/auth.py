"""saslStart, saslContinue, authenticate, logout, and the auth parts of hello and
connectionStatus, answered as mongod 8.0 answers them (the SCRAM itself: cdcserver/auth.py).

mongod keeps one authentication session per connection: saslStart (or hello's
speculativeAuthenticate) starts it, saslContinue needs it, and it ends when the
conversation succeeds or fails. A failed step is 18 "Authentication failed." whatever the
cause; the cause goes to the log only.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from typing import Any

from cdcserver import auth
from cdcserver.commands.base import Handler, family
from cdcserver.config import AuthConfig
from cdcserver.context import ConnectionState, ServerState
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

# The authentication commands' own table (which modes serve them: cdcserver/deployments/).
TABLE: dict[str, Handler] = {}
command = family(TABLE)

log = logging.getLogger(__name__)


def _missing(cmd_name: str, field: str) -> MongoError:
    return MongoError(40414, f"BSON field '{cmd_name}.{field}' is missing but a required field")


def _payload(cmd_name: str, value: Any) -> tuple[bytes, bool]:
    """The SASL payload's bytes, and whether the client sent it as a base64 string (the
    reply then answers in kind)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), False
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True), True
        except ValueError:
            raise MongoError(2, "Invalid base64 encoded payload") from None
    raise MongoError(
        14,
        f"BSON field '{cmd_name}.payload' is the wrong type '{type_name(value)}', expected "
        "types '[string, binData]'",
    )


def _reply(done: bool, payload: bytes, as_string: bool) -> dict[str, Any]:
    out: bytes | str = base64.b64encode(payload).decode() if as_string else payload
    return {"conversationId": 1, "done": done, "payload": out}


def _step(
    server: ServerState, conn: ConnectionState, payload: bytes, as_string: bool
) -> dict[str, Any]:
    state = auth.ServerAuth.of(conn)
    conversation = state.conversation
    assert conversation is not None
    try:
        done, out = conversation.step(payload)
    except MongoError:
        state.conversation = None  # the session ends with the failure
        log.info(
            "connection %d: authentication failed (%s, %s@%s, speculative %s): %s",
            conn.id, conversation.mechanism, conversation.user_name, conversation.db,
            state.speculative, conversation.failure,
        )
        raise
    user = conversation.user
    if user is not None and user not in state.users:
        previous = state.users[0] if state.users else None
        if previous is not None and previous.full_name != user.full_name:
            state.conversation = None
            raise MongoError(
                5626701,
                "Each client connection may only be authenticated once. Previously "
                f"authenticated as: {previous.full_name}",
            )
        state.users = [user]
        log.info("connection %d: authenticated as %s (%s%s)", conn.id, user.full_name,
                 conversation.mechanism, ", speculative" if state.speculative else "")
    if done:
        state.conversation = None
    return _reply(done, out, as_string)


def _start(
    server: ServerState, conn: ConnectionState, cmd: Mapping[str, Any], db: str,
    speculative: bool,
) -> dict[str, Any]:
    mechanism = cmd.get("mechanism")
    if mechanism is None:
        raise _missing("saslStart", "mechanism")
    if "payload" not in cmd:
        raise _missing("saslStart", "payload")
    if not isinstance(mechanism, str):
        raise MongoError(
            14,
            f"BSON field 'saslStart.mechanism' is the wrong type '{type_name(mechanism)}', "
            "expected type 'string'",
        )
    payload, as_string = _payload("saslStart", cmd["payload"])
    state = auth.ServerAuth.of(conn)
    state.conversation = None  # a new saslStart abandons the session before it
    if mechanism not in auth.MECHANISMS or db == "$external":
        raise auth.AuthError(
            334, f"Unsupported mechanism '{mechanism}' on authentication database '{db}'"
        )
    skip = False
    options = cmd.get("options")
    if isinstance(options, Mapping) and "skipEmptyExchange" in options:
        if not isinstance(options["skipEmptyExchange"], bool):
            raise MongoError(2, "skipEmptyExchange must be boolean")
        skip = options["skipEmptyExchange"]
    registry = server.auth.registry if server.auth is not None else _NO_USERS
    state.conversation = auth.ScramConversation(
        mechanism, db, registry, skip_empty_exchange=skip
    )
    state.speculative = speculative
    state.last_mechanism = mechanism
    return _step(server, conn, payload, as_string)


_NO_USERS = auth.UserRegistry(AuthConfig())


@command("saslStart")
async def sasl_start(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return _start(server, conn, cmd, db, speculative=False)


@command("saslContinue")
async def sasl_continue(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    state = auth.ServerAuth.of(conn)
    if state.conversation is None:
        raise auth.AuthError(17, "No SASL session state found")
    if "payload" not in cmd:
        raise _missing("saslContinue", "payload")
    if "conversationId" not in cmd:
        raise _missing("saslContinue", "conversationId")
    payload, as_string = _payload("saslContinue", cmd["payload"])
    if cmd.get("conversationId") != 1:
        raise auth.AuthError(17, "sasl: Mismatched conversation id")
    return _step(server, conn, payload, as_string)


@command("authenticate")
async def authenticate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    # mongod's authenticate serves MONGODB-X509 only; cdcserver has no X.509 users, and
    # mongod reports every other failure of this command as the generic one.
    auth.ServerAuth.of(conn).conversation = None
    raise auth.authentication_failed()


@command("logout")
async def logout(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    state = auth.ServerAuth.of(conn)
    state.users = [u for u in state.users if u.db != db]
    state.conversation = None
    return {}


@command("getnonce")
async def getnonce(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    raise MongoError(59, "no such command: 'getnonce'")  # removed in MongoDB 6.0


def auth_info(conn: ConnectionState) -> dict[str, Any]:
    """connectionStatus's authInfo."""
    users = conn.auth.users if conn.auth is not None else []
    roles: list[dict[str, str]] = []
    for u in users:
        for role, db in u.roles:
            if {"role": role, "db": db} not in roles:
                roles.append({"role": role, "db": db})
    return {
        "authenticatedUsers": [{"user": u.name, "db": u.db} for u in users],
        "authenticatedUserRoles": roles,
    }


def hello_auth_fields(
    server: ServerState, conn: ConnectionState, cmd: Mapping[str, Any]
) -> dict[str, Any]:
    """hello's saslSupportedMechs and speculativeAuthenticate (appended last, as mongod)."""
    out: dict[str, Any] = {}
    asked = cmd.get("saslSupportedMechs")
    if isinstance(asked, str):
        db, dot, name = asked.partition(".")
        if not dot:
            raise MongoError(2, "UserName must contain a '.' separated database.user pair")
        registry = server.auth.registry if server.auth is not None else None
        user = registry.find(name, db) if registry is not None else None
        if registry is not None and user is not None:
            out["saslSupportedMechs"] = registry.mechanisms_for(user)
    spec = cmd.get("speculativeAuthenticate")
    if spec is not None:
        if not isinstance(spec, Mapping):
            raise MongoError(2, "speculativeAuthenticate must be an object")
        if isinstance(spec.get("db"), str) and spec.get("mechanism") != "MONGODB-X509":
            try:
                out["speculativeAuthenticate"] = _start(
                    server, conn, spec, spec["db"], speculative=True
                )
            except MongoError:
                pass  # as mongod: a failed speculative start is as if none was sent
    return out
