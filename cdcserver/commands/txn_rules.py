"""Which commands may run inside a multi-document transaction, as mongod 8.0 decides.

mongod checks this (CommandHelpers::canUseTransactions) in ServiceEntryPointCommon before it
checks out the session: a refused command neither starts nor aborts the transaction (jstests
core/txns/commands_not_allowed_in_txn.js), and 263 carries no TransientTransactionError label.
Errors raised while a command runs inside the transaction abort it
(invokeWithSessionCheckedOut); `on_error` hooks let the store do that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline_stages.errors import MongoError

# The commands whose Command::allowedInTransactions() is true in mongod 8.0 (internal
# cluster*/_shardsvr* commands left out: cdcserver does not register them).
ALLOWED_IN_TRANSACTIONS = frozenset({
    "abortTransaction", "aggregate", "bulkWrite", "commitTransaction",
    "coordinateCommitTransaction", "create", "createIndexes", "delete", "distinct", "find",
    "findAndModify", "findandmodify", "getMore", "insert", "killCursors", "prepareTransaction",
    "update",
})

COUNT_MESSAGE = (
    "Cannot run 'count' in a multi-document transaction. Please see "
    "http://dochub.mongodb.org/core/transaction-count for a recommended alternative."
)

# Called with (server, command) when a command with `autocommit: false` failed.
ErrorHook = Callable[[Any, Mapping[str, Any]], None]
ERROR_HOOKS: list[ErrorHook] = []


def in_transaction(cmd: Mapping[str, Any]) -> bool:
    return "autocommit" in cmd and cmd.get("autocommit") is False


def check_allowed(name: str, cmd: Mapping[str, Any]) -> None:
    """263 OperationNotSupportedInTransaction for a command mongod refuses in a transaction
    (the namespace checks follow in the handlers, as in canUseTransactions)."""
    if not in_transaction(cmd):
        return
    if name == "count":
        raise MongoError(263, COUNT_MESSAGE)
    if name not in ALLOWED_IN_TRANSACTIONS:
        raise MongoError(263, f"Cannot run '{name}' in a multi-document transaction.")


def failed_in_transaction(server: Any, name: str, cmd: Mapping[str, Any]) -> None:
    """A command of a transaction failed while it ran: mongod aborts the transaction (not for
    commitTransaction/abortTransaction, which answer for the transaction themselves)."""
    if not in_transaction(cmd) or name in ("commitTransaction", "abortTransaction"):
        return
    for hook in ERROR_HOOKS:
        hook(server, cmd)
