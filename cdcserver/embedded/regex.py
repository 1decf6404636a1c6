"""`$regex` in the embedded store's scans: patterns RE2 cannot run, off the event loop.

What a `$regex` means, its parse errors and its RE2 translation are pipeline_stages/regex.py's.
Its fallback for the few patterns RE2 cannot express matches with Python's `re`, a
backtracking engine without a match limit (`^(a+)+(?=b)` on 40 characters runs for hours).
A scan holding such a regex runs in a thread (query.py, OFFLOAD), and this module's fallback
then matches in a worker process that is killed when the command's deadline passes: Python's
`re` never releases the GIL, so a thread alone would still hold the loop, and nothing can stop
a match in progress. Outside such a thread (inside a write) it matches in-process, as the pure
fallback does.
"""

from __future__ import annotations

import atexit
import marshal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from pipeline_stages import regex as _pure
from pipeline_stages.errors import MongoError

__all__ = ["backtracking_deadline", "compile_filter", "stats"]

stats = {"offloaded": 0}  # matches run in a worker process (tests wait for one to start)

# Set (to a time.monotonic() deadline, or None for none) in a thread that runs a scan off the
# event loop: its backtracking matches then run in a worker process.
_IN_PROCESS: Any = object()
backtracking_deadline: ContextVar[Any] = ContextVar("backtracking_deadline", default=_IN_PROCESS)


class _Fallback(_pure.PythonMatcher):
    """A pattern RE2 cannot express: in a worker process where a scan runs off the event loop
    (`backtracking_deadline` set), else in-process."""

    def search(self, text: str) -> bool:
        deadline = backtracking_deadline.get()
        if deadline is _IN_PROCESS:
            return super().search(text)
        subject = self.subject(text)
        if subject is None:
            return False
        stats["offloaded"] += 1
        return _worker().search(self.pattern, self.flags, subject, deadline)


def compile_filter(filter_doc: Mapping[str, Any]) -> dict[str, Any]:
    """pipeline_stages/regex.py's `compile_filter`, with the worker-process fallback."""
    return _pure.compile_filter(filter_doc, _Fallback)


_WORKER_CODE = """
import marshal, re, sys
read, write = sys.stdin.buffer.read, sys.stdout.buffer
cache = {}
while True:
    head = read(4)
    if len(head) < 4:
        break
    pattern, flags, text = marshal.loads(read(int.from_bytes(head, "big")))
    rx = cache.get((pattern, flags))
    if rx is None:
        rx = cache[(pattern, flags)] = re.compile(pattern, flags)
    write.write(b"1" if rx.search(text) else b"0")
    write.flush()
"""


class _Worker:
    """A child process matching with Python's `re`, one per thread that uses it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def search(self, pattern: str, flags: int, text: str, deadline: float | None) -> bool:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            proc = self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WORKER_CODE],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
        assert proc.stdin is not None and proc.stdout is not None
        request = marshal.dumps((pattern, flags, text))
        # At the deadline the worker is killed (its match may never end): the read then ends.
        timer = None
        if deadline is not None:
            timer = threading.Timer(max(deadline - time.monotonic(), 0.0), proc.kill)
            timer.daemon = True
            timer.start()
        try:
            proc.stdin.write(len(request).to_bytes(4, "big") + request)
            proc.stdin.flush()
            answer = proc.stdout.read(1)
        except OSError:
            answer = b""
        finally:
            if timer is not None:
                timer.cancel()
        if answer in (b"0", b"1"):
            return answer == b"1"
        self.close()
        if deadline is not None and time.monotonic() >= deadline:
            raise MongoError(50, "operation exceeded time limit")
        raise MongoError(51156, "Error occurred while executing the regular expression. "
                         "Result code: the matching process ended")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


_workers = threading.local()
_all_workers: list[_Worker] = []


def _worker() -> _Worker:
    worker = getattr(_workers, "worker", None)
    if worker is None:
        worker = _workers.worker = _Worker()
        _all_workers.append(worker)
    return worker


@atexit.register
def _close_workers() -> None:
    for worker in _all_workers:
        worker.close()
