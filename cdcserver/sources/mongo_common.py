"""What the upstream modules share: options, errors, the raw codec and cursor helpers.

The upstream source (a live replica set's `local.oplog.rs`) is split along what it asks of
mongod: `mongo_tail.py` tails the oplog and follows the majority commit point,
`mongo_history.py` reads history behind the live window and transaction entries,
`mongo_images.py` fetches pre-images and updateLookup documents; `mongo.py` is the facade.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages.check_resumability import HISTORY_LOST_MESSAGE
from pipeline_stages.error_codes import CATEGORIES
from pipeline_stages.error_labels import NOT_PRIMARY_ERROR, SHUTDOWN_ERROR
from pipeline_stages.errors import MongoError

RAW = CodecOptions(document_class=RawBSONDocument)
MAX_TS = Timestamp(0xFFFFFFFF, 0xFFFFFFFF)
# Codes of the upstream's errors that say "this oplog position is gone".
CAPPED_POSITION_LOST = 136
# error_codes.yml's NotPrimaryError and ShutdownError categories, less internal-only codes (the
# proxy tells its client's topology, as a driver does, so the next command finds the primary).
NOT_PRIMARY_CODES = NOT_PRIMARY_ERROR | (SHUTDOWN_ERROR - CATEGORIES["InternalOnly"])
# What closing may spend talking to the upstream (killCursors, endSessions), all steps
# together: with the upstream dead or stalled pymongo would wait serverSelectionTimeoutMS for
# each, and a shutdown must end within its grace whatever the upstream's state.
CLOSE_TIMEOUT_S = 1.0


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


@dataclass
class UpstreamOptions:
    """How the upstream is read (`[upstream]` in the config file)."""

    uri: str
    batch_size: int = 1000  # batchSize of the tail's find/getMore
    max_await_ms: int = 1000  # awaitData wait of the tail's getMores
    window_entries: int = 100_000  # live window: entries kept for cursors near the head
    window_bytes: int = 256 * 1024 * 1024
    history_batch: int = 1000  # batchSize of history reads
    history_keep: int = 20_000  # entries a history segment keeps (readers behind re-read)
    history_segments: int = 16  # history readers open at once
    history_idle_s: float = 60.0  # a history reader nobody read from for this long closes
    majority_poll_ms: float = 2.0  # hello interval while entries wait for the commit point
    backoff_initial_ms: float = 50.0  # reconnect backoff (doubles, with jitter)
    backoff_max_ms: float = 5000.0
    oldest_refresh_s: float = 5.0  # how often the upstream's oldest entry is re-read
    lookup_timeout_ms: float = 2000.0  # updateLookup / pre-image / oplog entry lookups
    uuid_cache_s: float = 1.0  # collection UUIDs (updateLookup's UUID check) are re-read after
    # The durable log of what was tailed (sources/retained.py): its data directory (None: no
    # log, history is the window and the upstream's oplog), and its retention (either limit
    # exceeded drops the oldest entries; 0: no limit of that kind).
    retain_dir: str | None = None
    retain_mb: float = 1024
    retain_hours: float = 168.0
    # Options for both clients (AsyncMongoClient for the tail, history and lookups; MongoClient
    # only for `prime`, before serving),
    # beyond what the URI says (its auth and TLS options apply as given).
    client_options: dict[str, Any] = field(default_factory=dict)


class UpstreamError(MongoError):
    """The upstream cannot be reached (6, 89: resumable for a change stream, the driver
    resumes from its last token) or answered an error (its code and codeName)."""

    def __init__(
        self, code: int, errmsg: str, labels: Sequence[str] = (), code_name: str | None = None
    ) -> None:
        super().__init__(code, errmsg, labels)
        self._code_name = code_name

    @property
    def code_name(self) -> str:
        return self._code_name or super().code_name


def upstream_unavailable(what: str, exc: BaseException) -> UpstreamError:
    """A pymongo error from the upstream as the error of the command it happened in: a
    timeout is NetworkTimeout (89), a lost or refused connection HostUnreachable (6), both
    resumable; an error the upstream answered (e.g. Unauthorized) keeps its code."""
    from pymongo.errors import ConnectionFailure, ExecutionTimeout, NetworkTimeout, OperationFailure

    if isinstance(exc, (NetworkTimeout, ExecutionTimeout)):
        return UpstreamError(89, f"{what}: the upstream did not answer in time: {exc}")
    if isinstance(exc, OperationFailure) and not isinstance(exc, ConnectionFailure):
        details = exc.details or {}
        errmsg = details.get("errmsg", str(exc))
        return UpstreamError(
            exc.code or 1, f"{what}: the upstream answered: {errmsg}",
            code_name=details.get("codeName"),
        )
    return UpstreamError(6, f"{what}: the upstream is unreachable: {exc}")


def history_lost() -> MongoError:
    return MongoError(286, HISTORY_LOST_MESSAGE)


async def next_batch(cursor: Any) -> list[RawBSONDocument]:
    """One batch: what the cursor holds, else one find/getMore (an awaitData getMore waits up
    to its maxAwaitTimeMS). Empty when that getMore found nothing or the cursor is dead."""
    batch: list[RawBSONDocument] = []
    await cursor._next_batch(batch)  # noqa: SLF001  (pymongo >= 4.9; public API reads per doc)
    return batch


async def close_cursor(cursor: Any, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close a cursor on the upstream (killCursors) within `timeout_s`: a dead upstream must
    not hold a reconnect or a shutdown for a server selection timeout."""
    import pymongo

    if cursor is not None and timeout_s > 0:
        with contextlib.suppress(Exception), pymongo.timeout(timeout_s):
            async with asyncio.timeout(timeout_s + 0.1):
                await cursor.close()
    return None
