"""getMore's session checks: a cursor answers a getMore only in the session, and the
transaction, it was opened in.

mongod (src/mongo/db/commands/getmore_cmd.cpp validateLSID, validateTxnNumber: 50736-50741)
and mongos (src/mongo/s/query/cluster_find.cpp: the same checks as 50799-50804) make them as
the cursor is pinned, after 43 (not found) and 143 (in use), before the namespace check (13):
a refused getMore leaves the cursor open (mongod's pin check; mongos returns the cursor to its
manager).

The session a cursor was opened in is noted when the command that opened it answers
(`note_opened`, from run_command): the full session id (the client's id and the running
user's digest, as mongod makes it) and, for a cursor opened in a multi-document transaction,
its txnNumber.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdcserver.commands.transactions import full_lsid, lsid_str
from cdcserver.commands.txn_rules import in_transaction
from cdcserver.context import ServerState
from cdcserver.cursors import Cursor
from pipeline_stages.errors import MongoError

_ATTR = "_opened_in"


@dataclass(frozen=True)
class OpenedIn:
    """The session (None: none) and transaction number (None: not in a transaction) of the
    command that opened a cursor."""

    lsid: dict[str, Any] | None
    txn_number: int | None


def _lsid_of(cmd: Mapping[str, Any]) -> dict[str, Any] | None:
    lsid = cmd.get("lsid")
    return full_lsid(lsid) if isinstance(lsid, Mapping) else None


def _txn_number_of(cmd: Mapping[str, Any]) -> int | None:
    number = cmd.get("txnNumber")
    if isinstance(number, int) and not isinstance(number, bool):
        return int(number)
    return None


def note_opened(server: ServerState, cmd: Mapping[str, Any], reply: Any) -> None:
    """A reply that hands the client a cursor this server registered: the cursor keeps the
    session and transaction of the command that opened it (a getMore's own reply names a
    cursor already noted)."""
    if not isinstance(reply, dict):
        return  # a forwarded reply as it came
    doc = reply.get("cursor")
    if not isinstance(doc, dict):
        return
    cursor = server.cursors.find(doc.get("id"))
    if cursor is None or hasattr(cursor, _ATTR):
        return
    txn = _txn_number_of(cmd) if in_transaction(cmd) else None
    setattr(cursor, _ATTR, OpenedIn(_lsid_of(cmd), txn))


def _same_session(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return bool(_key(a.get("id")) == _key(b.get("id"))
                and _key(a.get("uid")) == _key(b.get("uid")))


def _key(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return value


def check(cursor: Cursor, cmd: Mapping[str, Any], router: bool) -> None:
    """mongod's validateLSID and validateTxnNumber (mongos's, with its codes, when `router`)
    for a getMore `cmd` on `cursor`. A cursor opened before it was noted (none is) passes."""
    opened: OpenedIn | None = getattr(cursor, _ATTR, None)
    if opened is None:
        return
    cid = cursor.id
    lsid = _lsid_of(cmd)
    base = 50799 if router else 50736
    if lsid is not None and opened.lsid is None:
        raise MongoError(base, f"Cannot run getMore on cursor {cid}, which was not created in a "
                               f"session, in session {lsid_str(lsid)}")
    if lsid is None and opened.lsid is not None:
        raise MongoError(base + 1, f"Cannot run getMore on cursor {cid}, which was created in "
                                   f"session {lsid_str(opened.lsid)}, without an lsid")
    if lsid is not None and opened.lsid is not None and not _same_session(lsid, opened.lsid):
        raise MongoError(base + 2, f"Cannot run getMore on cursor {cid}, which was created in "
                                   f"session {lsid_str(opened.lsid)}, in session "
                                   f"{lsid_str(lsid)}")
    # mongod 8.0 skips the txnNumber checks for a cursor opened outside a transaction when the
    # getMore is not in one either (SERVER-92480); mongos makes them always.
    if not router and opened.txn_number is None and not in_transaction(cmd):
        return
    txn = _txn_number_of(cmd)
    base = 50802 if router else 50739
    if txn is not None and opened.txn_number is None:
        raise MongoError(base, f"Cannot run getMore on cursor {cid}, which was not created in a "
                               f"transaction, in transaction {txn}")
    if txn is None and opened.txn_number is not None:
        raise MongoError(base + 1, f"Cannot run getMore on cursor {cid}, which was created in "
                                   f"transaction {opened.txn_number}, without a txnNumber")
    if txn is not None and opened.txn_number is not None and txn != opened.txn_number:
        raise MongoError(base + 2, f"Cannot run getMore on cursor {cid}, which was created in "
                                   f"transaction {opened.txn_number}, in transaction {txn}")
