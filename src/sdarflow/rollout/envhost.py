"""Where a rollout's envs run, addressed by episode index, and the watchdog every env call runs under.

``LocalEnvs`` keeps the envs in this process, ``ProcessEnvs`` in one worker process, so env work (Python that
holds the GIL) runs while this process generates. Both have one asynchronous form: ``submit(op, items)`` hands over
a batch of calls (``reset``/``close`` with item None, ``step`` with the action) and ``result()`` returns their
``Outcome``s in order; one batch is in flight at a time. Asked for ``infos``, a host adds to each Reset and each
Step that does not end the episode the env's ``admissible_commands()`` ("admissible") and its expert's next action,
``expert_action()`` ("expert").

The watchdog (``call_all``): env code is user code (plugins, simulators, interpreters), so one env that raises or
hangs must cost its episode, not the run. Each call runs in a *daemon* thread so that a call still hung when the run
ends cannot keep the process alive (``concurrent.futures`` workers are joined at interpreter exit, which would block
on it). A hung call's thread is abandoned: Python cannot kill a thread, so its env must not be used again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sdarflow.config import opt
from sdarflow.envs import EnvError, EnvSuite, Task

log = logging.getLogger(__name__)

ENV_HOSTS: tuple[str, ...] = ("auto", "process", "local")
Items = Sequence[tuple[int, Any]]
WORKER_GRACE_S = 60.0  # beyond the per-call limits, before a silent worker counts as frozen


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


def _run(fn: Callable[[], Any], out: Outcome) -> None:
    start = time.perf_counter()
    try:
        out.value = fn()
    # Deliberately broad: any failure inside env code ends that episode only (recorded, logged, counted).
    except Exception as err:
        frame = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
        where = f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else ""
        out.error = f"{type(err).__name__}: {err}{where}"
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


def envs_opt() -> str:
    """The ``envs`` field of the stages that run rollouts."""
    return opt(
        "auto",
        "where envs run: process = a worker process, two lanes of episodes taking turns so env steps overlap "
        "generation; local = this process; auto = process when generation runs on a GPU, else local (on a CPU "
        "the worker takes cores from generation)",
        choices=ENV_HOSTS,
    )


def in_worker(envs: str, device: object) -> bool:
    """Whether ``--envs`` puts the envs in a worker process when the engine generates on ``device``."""
    return envs == "process" or (envs == "auto" and str(device).startswith("cuda"))


def _call(env, op: str, arg: Any, infos: frozenset[str]) -> Any:
    if op == "close":
        return env.close()
    value = env.step(arg) if op == "step" else env.reset()
    if getattr(value, "done", False):
        return value
    if "admissible" in infos and hasattr(env, "admissible_commands"):
        value = dataclasses.replace(value, admissible=tuple(env.admissible_commands()))
    if "expert" in infos and hasattr(env, "expert_action"):
        value = dataclasses.replace(value, expert=env.expert_action())
    return value


class LocalEnvs:
    """The envs in this process; a batch runs when its result is asked for."""

    def __init__(
        self,
        suite: EnvSuite,
        tasks: Sequence[Task],
        timeout_s: float,
        workers: int,
        infos: frozenset[str] = frozenset(),
    ) -> None:
        self.envs = [suite.make(task) for task in tasks]
        self.infos = infos
        # The env's own turn limit, where it has one (the loop also counts malformed turns against it).
        self.max_turns: list[int | None] = [getattr(env, "max_turns", None) for env in self.envs]
        self.timeout_s, self.workers = timeout_s, workers
        self._pending: tuple[str, Items] | None = None

    def submit(self, op: str, items: Items) -> None:
        self._pending = (op, items)

    def result(self) -> list[Outcome]:
        op, items = self._pending
        self._pending = None
        calls = [functools.partial(_call, self.envs[i], op, arg, self.infos) for i, arg in items]
        return call_all(calls, self.timeout_s, self.workers)

    def shutdown(self) -> None:
        """Nothing to stop: the envs are closed through ``close`` calls."""


def _serve(
    conn, suite: EnvSuite, tasks: Sequence[Task], timeout_s: float, workers: int, infos: frozenset[str]
) -> None:
    """The worker: build the envs, then answer batches until told to stop (None)."""
    try:
        host = LocalEnvs(suite, tasks, timeout_s, workers, infos)
    except Exception as err:  # the suite's own error, shown in the parent as one line
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ok", host.max_turns))
    while (request := conn.recv()) is not None:
        host.submit(*request)
        conn.send(("ok", host.result()))


class ProcessEnvs:
    """The envs in a worker process started from a forkserver (a clean process: it inherits none of the engine's
    threads); ``submit`` returns at once and the worker runs the batch while this process generates."""

    def __init__(
        self,
        suite: EnvSuite,
        tasks: Sequence[Task],
        timeout_s: float,
        workers: int,
        infos: frozenset[str] = frozenset(),
    ) -> None:
        ctx = multiprocessing.get_context("forkserver")
        # Imported once in the forkserver (textworld takes ~1 s), not in every worker it forks.
        ctx.set_forkserver_preload([__name__, type(suite).__module__])
        self._conn, child = ctx.Pipe()
        args = (child, suite, tasks, timeout_s, workers, infos)
        self._proc = ctx.Process(target=_serve, args=args, daemon=True, name="sdarflow-envs")
        self._proc.start()
        child.close()
        self.timeout_s = timeout_s
        self._size = 0
        try:
            self.max_turns: list[int | None] = self._receive(len(tasks))
        except EnvError:
            self.shutdown()
            raise

    def submit(self, op: str, items: Items) -> None:
        self._size = len(items)
        try:
            self._conn.send((op, list(items)))
        except OSError as err:  # the worker is gone: say so as _receive does
            raise self._exited() from err

    def result(self) -> list[Outcome]:
        return self._receive(self._size)

    def _receive(self, calls: int) -> Any:
        limit = None if self.timeout_s <= 0 else calls * self.timeout_s + WORKER_GRACE_S
        try:
            if not self._conn.poll(limit):
                raise EnvError(
                    f"the env worker gave no answer in {limit:.0f} s (an env holds the interpreter, so the per-call "
                    f"watchdog cannot run); fix: find the env that hangs (its logs above), or lower --step-timeout-s"
                )
            status, value = self._conn.recv()
        except (EOFError, ConnectionError) as err:
            raise self._exited() from err
        if status == "error":
            raise EnvError(f"env worker: {value}")
        return value

    def _exited(self) -> EnvError:
        self._proc.join(5)
        return EnvError(
            f"the env worker exited (code {self._proc.exitcode}); fix: see its traceback above. A script that runs "
            f'rollouts must guard its entry point with `if __name__ == "__main__":` (the worker imports the main '
            f"module); or run envs in this process (--envs local, RolloutParams.env_process=False)"
        )

    def shutdown(self) -> None:
        """Stop the worker (closed envs first, through ``close`` calls); kill it if it does not stop."""
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()


def open_envs(
    suite: EnvSuite,
    tasks: Sequence[Task],
    timeout_s: float,
    workers: int,
    in_process: bool,
    infos: frozenset[str] = frozenset(),
) -> LocalEnvs | ProcessEnvs:
    """``ProcessEnvs`` unless ``in_process``, or the suite or its tasks cannot be sent to a worker (pickle); both
    add the envs' ``infos`` ("admissible", "expert") to their resets and steps."""
    if not in_process:
        try:
            pickle.dumps((suite, list(tasks)))
        except Exception as err:
            log.info("%s: envs run in this process (the suite cannot go to a worker: %s)", suite.name, err)
        else:
            return ProcessEnvs(suite, tasks, timeout_s, workers, infos)
    return LocalEnvs(suite, tasks, timeout_s, workers, infos)
