"""User management commands (createUser, updateUser, dropUser, dropAllUsersFromDatabase) over
the server's user registry (cdcserver/auth.py), with mongod's argument checks and errors.

The users made here live as long as the server: `[auth]` in the configuration stays where
durable users are declared. With authentication off, the first user made starts a registry
(commands stay unchecked, as `[auth] enabled = false` has them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdcserver.auth import MECHANISMS, ServerAuth, User, UserRegistry, derive_credentials
from cdcserver.commands.base import Handler, family
from cdcserver.config import AuthConfig, ScramCredentials
from cdcserver.context import ConnectionState, ServerState
from cdcserver.roles import role_grants
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

TABLE: dict[str, Handler] = {}
_command = family(TABLE)


def _registry(server: ServerState) -> UserRegistry:
    if server.auth is None:
        server.auth = ServerAuth(AuthConfig())
    return server.auth.registry


def _name(cmd: Mapping[str, Any], command: str) -> str:
    name = cmd.get(command)
    if not isinstance(name, str):
        raise MongoError(14, f"BSON field '{command}.{command}' is the wrong type "
                         f"'{type_name(name)}', expected type 'string'")
    if not name:
        raise MongoError(2, "User document needs 'user' field to be non-empty")
    return name


def _roles(cmd: Mapping[str, Any], command: str, db: str) -> tuple[tuple[str, str], ...]:
    roles = cmd.get("roles")
    if not isinstance(roles, list):
        raise MongoError(14, f"BSON field '{command}.roles' is the wrong type "
                         f"'{type_name(roles)}', expected type 'array'")
    out: list[tuple[str, str]] = []
    for r in roles:
        if isinstance(r, str):
            role, role_db = r, db
        elif isinstance(r, Mapping) and isinstance(r.get("role"), str) and isinstance(
            r.get("db"), str
        ):
            role, role_db = r["role"], r["db"]
        else:
            raise MongoError(2, "User and role names must be either strings or objects")
        try:
            role_grants(role, role_db)
        except ValueError:
            raise MongoError(31, f"Could not find role: {role}@{role_db}") from None
        out.append((role, role_db))
    return tuple(out)


def _password(cmd: Mapping[str, Any], command: str) -> str | None:
    if "pwd" not in cmd:
        return None
    pwd = cmd["pwd"]
    if not isinstance(pwd, str):
        raise MongoError(14, f"BSON field '{command}.pwd' is the wrong type "
                         f"'{type_name(pwd)}', expected type 'string'")
    if not pwd:
        raise MongoError(2, "User passwords must not be empty")
    return pwd


def _mechanisms(cmd: Mapping[str, Any], command: str) -> list[str]:
    mechs = cmd.get("mechanisms", list(MECHANISMS))
    if not isinstance(mechs, list) or not mechs:
        raise MongoError(2, "mechanisms field must not be empty")
    for m in mechs:
        if m not in MECHANISMS:
            raise MongoError(2, f"Unknown auth mechanism '{m}'")
    return mechs


def _user(
    name: str, db: str, roles: tuple[tuple[str, str], ...],
    credentials: Mapping[str, ScramCredentials],
) -> User:
    grants = tuple(g for role, role_db in roles for g in role_grants(role, role_db))
    return User(name, db, roles, credentials, grants)


@_command("createUser")
async def create_user(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    name = _name(cmd, "createUser")
    if db == "local":
        raise MongoError(2, "Cannot create users in the local database")
    pwd = _password(cmd, "createUser")
    if pwd is None and db != "$external":
        raise MongoError(2, "Must provide a 'pwd' field for all user documents, except those "
                         "with '$external' as the user's source db")
    roles = _roles(cmd, "createUser", db)
    mechanisms = _mechanisms(cmd, "createUser")
    registry = _registry(server)
    if (name, db) in registry.users:
        raise MongoError(51003, f'User "{name}@{db}" already exists')
    creds = {m: derive_credentials(m, name, pwd) for m in mechanisms} if pwd else {}
    registry.users[(name, db)] = _user(name, db, roles, creds)
    return {}


@_command("updateUser")
async def update_user(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    name = _name(cmd, "updateUser")
    pwd = _password(cmd, "updateUser")
    roles = _roles(cmd, "updateUser", db) if "roles" in cmd else None
    mechanisms = _mechanisms(cmd, "updateUser") if "mechanisms" in cmd else None
    if pwd is None and roles is None and mechanisms is None and "customData" not in cmd:
        raise MongoError(2, "Must specify at least one field to update in updateUser")
    registry = server.auth.registry if server.auth is not None else None
    user = registry.users.get((name, db)) if registry is not None else None
    if registry is None or user is None:
        raise MongoError(11, f"User '{name}@{db}' not found")
    creds = dict(user.credentials)
    if pwd is not None:
        creds = {m: derive_credentials(m, name, pwd) for m in (mechanisms or list(creds))}
    elif mechanisms is not None:
        creds = {m: c for m, c in creds.items() if m in mechanisms}
    registry.users[(name, db)] = _user(name, db, roles if roles is not None else user.roles,
                                       creds)
    return {}


@_command("dropUser")
async def drop_user(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    name = _name(cmd, "dropUser")
    registry = server.auth.registry if server.auth is not None else None
    if registry is None or registry.users.pop((name, db), None) is None:
        raise MongoError(11, f"User '{name}@{db}' not found")
    return {}


@_command("dropAllUsersFromDatabase")
async def drop_all_users(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    registry = server.auth.registry if server.auth is not None else None
    if registry is None:
        return {"n": 0}
    mine = [key for key in registry.users if key[1] == db]
    for key in mine:
        del registry.users[key]
    return {"n": len(mine)}
