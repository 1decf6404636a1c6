"""One deadline and one cooperative yield for every scan a user can make long: `maxTimeMS`
(50 MaxTimeMSExpired) and the event loop's fairness hold wherever a command reads many
documents or entries (the oplog, capped collections' tailable cursors, pre-images, ...).

mongod's plan executors count the documents they examine, check the operation's deadline
(its interrupt check) between them, and yield. Here a scan tells its `ScanBudget` how many
documents it examined; every `CHECK_EVERY` of them the budget reads the clock once: past the
deadline it raises 50 "operation exceeded time limit"; after `YIELD_AFTER_S` of work since the
loop's last turn, it asks the scan to pause (`await budget.pause()`), so other connections are
served while one scan runs. A synchronous caller (one that must not interleave) counts the same
way and never pauses: the deadline still holds.

The clock is read only at those checks, so time, as the budget sees it, is a function of the
documents examined: tests replace `clock` to make a scan's timeout depend on what it read,
never on how fast the machine is, and hold a scan at a pause through `pause_hook`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline_stages.errors import MongoError

__all__ = [
    "CHECK_EVERY", "MAX_TIME_MS_EXPIRED", "YIELD_AFTER_S", "ScanBudget", "clock", "pause_hook",
    "stats",
]

YIELD_AFTER_S = 0.005  # work between two turns of the event loop (the query engine's too)
CHECK_EVERY = 64  # documents examined between two interrupt checks
MAX_TIME_MS_EXPIRED = (50, "operation exceeded time limit")
# Read at each interrupt check (tests replace it: see the module's docstring).
clock: Callable[[], float] = time.monotonic
# Awaited at every pause (tests use it to hold a scan part-way).
pause_hook: Callable[[], Awaitable[None]] | None = None
# Documents examined and pauses made by budgeted scans (tests check where a scan stopped).
stats = {"examined": 0, "pauses": 0}


def max_time_expired() -> MongoError:
    return MongoError(*MAX_TIME_MS_EXPIRED)


def _positive_ms(max_time_ms: Any) -> float | None:
    if isinstance(max_time_ms, bool) or not isinstance(max_time_ms, (int, float)):
        return None
    return float(max_time_ms) if max_time_ms > 0 else None


class ScanBudget:
    """One operation's deadline (a positive `maxTimeMS`; none when absent or 0) and its
    scan's turns of the event loop. Made when the operation starts: that is its first
    interrupt check."""

    __slots__ = ("at", "_unchecked", "_turn_from")

    def __init__(self, max_time_ms: Any = None, *, remaining_s: float | None = None) -> None:
        now = clock()
        ms = _positive_ms(max_time_ms)
        self.at: float | None = (
            now + ms / 1000 if ms is not None
            else now + remaining_s if remaining_s is not None else None
        )
        self._unchecked = 0  # examined since the last check
        self._turn_from = now  # when the loop last had a turn
        self._check(now)

    def _check(self, now: float) -> None:
        if self.at is not None and now >= self.at:
            raise max_time_expired()

    def remaining_s(self) -> float | None:
        """The time left before the deadline (None: no deadline), as of now."""
        return None if self.at is None else self.at - clock()

    def examined(self, n: int = 1) -> bool:
        """Count `n` documents examined. At each interrupt check: 50 past the deadline; True
        when the scan has worked `YIELD_AFTER_S` since the loop's last turn (an async scan
        then awaits `pause`)."""
        stats["examined"] += n
        self._unchecked += n
        if self._unchecked < CHECK_EVERY:
            return False
        self._unchecked = 0
        now = clock()
        self._check(now)
        return now - self._turn_from >= YIELD_AFTER_S

    async def pause(self) -> None:
        """Give the event loop a turn, then check the deadline again (the turn took time)."""
        stats["pauses"] += 1
        hook = pause_hook
        if hook is not None:
            await hook()
        await asyncio.sleep(0)
        now = clock()
        self._turn_from = now
        self._check(now)

    async def step(self, n: int = 1) -> None:
        """`examined(n)`, then the pause it asks for."""
        if self.examined(n):
            await self.pause()
