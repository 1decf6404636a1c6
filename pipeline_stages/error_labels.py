"""mongod's error-label policy (src/mongo/db/error_labels.cpp, ErrorLabelBuilder): which
errors carry TransientTransactionError, RetryableWriteError, ResumableChangeStreamError and
NonResumableChangeStreamError, from the categories of pipeline_stages/error_codes.py.

Pure: the server (commands/failpoints.py, commands/registry.py) asks it for the labels of an
error reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages.error_codes import CATEGORIES

# Codes the generated table (mongod's master branch) puts in RetriableError / Interruption that
# cdcserver's 8.0 label sets never included: left out so the labels stay as they were. (Which of
# them mongod 8.0 already lists was not verified: no r8.0 copy of the yml was at hand.)
_NOT_IN_8_0_LABEL_SETS = frozenset({406, 407, 412, 453, 462, 91331, 10045600})


def _category(name: str) -> frozenset[int]:
    return CATEGORIES[name] - _NOT_IN_8_0_LABEL_SETS


NETWORK_ERROR = _category("NetworkError")
RETRIABLE_ERROR = _category("RetriableError")
NEED_RETARGETTING_ERROR = _category("NeedRetargettingError")
NOT_PRIMARY_ERROR = _category("NotPrimaryError")
SHUTDOWN_ERROR = _category("ShutdownError")
SNAPSHOT_ERROR = _category("SnapshotError")
NON_RESUMABLE_CHANGE_STREAM_ERROR = _category("NonResumableChangeStreamError")
# isResumableChangeStreamError: these codes, on an aggregate/getMore serving a change stream
# (FailedToSatisfyReadPreference, RetryChangeStream beyond the categories).
RESUMABLE_CHANGE_STREAM_CODES = (
    RETRIABLE_ERROR | NETWORK_ERROR | NEED_RETARGETTING_ERROR | frozenset({133, 234})
)
# isTransientTransactionError's explicit list (WriteConflict, LockTimeout,
# PreparedTransactionInProgress, ShardCannotRefreshDueToLocksHeld, StaleDbVersion).
TRANSIENT_TRANSACTION_CODES = frozenset({112, 24, 267, 343, 249})
_NO_SUCH_TRANSACTION = 251
_INTERNAL_TRANSACTION_NOT_SUPPORTED = 358
_COMMIT_OR_ABORT = frozenset({"commitTransaction", "abortTransaction"})


def error_labels(
    name: str,
    cmd: Mapping[str, Any],
    code: int | None,
    wc_code: int | None = None,
    *,
    change_stream: bool = False,
    internal_client: bool = False,
) -> list[str]:
    """mongod's ErrorLabelBuilder (error_labels.cpp): the labels of an error reply.

    `change_stream`: the command serves a change stream (an aggregate whose pipeline starts
    with `$changeStream`, or a getMore whose checked-out cursor is one).
    """
    labels: list[str] = []
    has_txn = cmd.get("txnNumber") is not None
    in_txn = has_txn and "autocommit" in cmd
    commit_or_abort = name in _COMMIT_OR_ABORT
    transient = False
    if code is not None and in_txn and code != _INTERNAL_TRANSACTION_NOT_SUPPORTED:
        if (
            code in TRANSIENT_TRANSACTION_CODES or code in SNAPSHOT_ERROR
            or code in NEED_RETARGETTING_ERROR
        ):
            transient = True
        elif commit_or_abort:
            transient = code == _NO_SUCH_TRANSACTION and wc_code is None
        else:
            transient = code in RETRIABLE_ERROR or code == _NO_SUCH_TRANSACTION
    retryable = False
    if transient:
        labels.append("TransientTransactionError")
    elif not internal_client and ((has_txn and not in_txn) or (in_txn and commit_or_abort)):
        retryable = (code is not None and code in RETRIABLE_ERROR) or (
            wc_code is not None and wc_code in RETRIABLE_ERROR
        )
        if retryable:
            labels.append("RetryableWriteError")
    resumable = (
        not transient and not retryable and change_stream and name in ("aggregate", "getMore")
        and code is not None and wc_code is None and code in RESUMABLE_CHANGE_STREAM_CODES
    )
    if resumable:
        labels.append("ResumableChangeStreamError")
    elif code in NON_RESUMABLE_CHANGE_STREAM_ERROR:
        labels.append("NonResumableChangeStreamError")
    return labels
