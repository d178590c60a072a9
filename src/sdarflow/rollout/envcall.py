"""Calling environment code under a watchdog: a per-call timeout, failures captured, several calls at once.

Env code is user code (plugins, simulators, interpreters): one env that raises or hangs must cost its episode,
not the run. Each call runs in a *daemon* thread so that a call still hung when the run ends cannot keep the
process alive (``concurrent.futures`` workers are joined at interpreter exit, which would block on it). A hung
call's thread is abandoned: Python cannot kill a thread, so its env must not be used again.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    """The result of one call: ``value`` when it returned, else ``error`` (one line: type, message, where)."""

    value: Any = None
    error: str | None = None
    seconds: float = 0.0
    # the call is still running in an abandoned thread: its env must not be used again
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def _describe(err: BaseException) -> str:
    frame = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    where = f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else ""
    return f"{type(err).__name__}: {err}{where}"


def _run(fn: Callable[[], Any], out: Outcome) -> None:
    start = time.perf_counter()
    try:
        out.value = fn()
    # Deliberately broad: any failure inside env code ends that episode only (recorded, logged, counted).
    except Exception as err:
        out.error = _describe(err)
    out.seconds = time.perf_counter() - start


def call_all(calls: Sequence[Callable[[], Any]], timeout_s: float, workers: int = 1) -> list[Outcome]:
    """Run ``calls``, at most ``workers`` at a time, each limited to ``timeout_s`` seconds (0: no limit); with
    no limit and one worker they run inline in this thread (no thread overhead, plain tracebacks)."""
    outcomes = [Outcome() for _ in calls]
    if timeout_s <= 0 and workers <= 1:
        for fn, out in zip(calls, outcomes):
            _run(fn, out)
        return outcomes
    step = max(1, workers)
    for lo in range(0, len(calls), step):
        chunk = range(lo, min(lo + step, len(calls)))
        threads = [
            threading.Thread(target=_run, args=(calls[i], outcomes[i]), daemon=True, name=f"env-call-{i}")
            for i in chunk
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        for i, t in zip(chunk, threads):
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                outcomes[i] = Outcome(
                    error=f"TimeoutError: no result within {timeout_s:g} s", seconds=timeout_s, timed_out=True
                )
    return outcomes
