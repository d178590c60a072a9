"""Stopping cleanly. Kubernetes and KFP stop a pod, and ``kill`` a process, with SIGTERM, whose default handler ends
Python on the spot: staging folders, temporary copies and half-written outputs stay behind. Here SIGTERM becomes an
exception (:class:`Terminated`) that unwinds through every ``with`` and ``finally`` first; the processes sdarflow
starts get the same signal and time to do the same. A signal arrives between Python bytecodes: a call blocked in C
(a collective, a long kernel) takes it when it returns."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

# how long a child stopped by SIGTERM gets to unwind before SIGKILL (inside Kubernetes' default 30 s grace period)
CHILD_GRACE_S = 20.0


class Terminated(BaseException):
    """SIGTERM as an exception (a BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it)."""


def _children() -> list[int]:
    """This process's child processes (Linux: read from /proc; elsewhere none are found)."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # the field after the parenthesized command name: state, then the parent's pid
            if int(stat.read_text().rpartition(")")[2].split()[1]) == me:
                found.append(int(stat.parent.name))
    return found


def _terminate(signum: int, frame: object) -> None:
    # once: a second SIGTERM during the unwind would interrupt the cleanups it runs
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # children started by code that is not ours (the KFP local runner's component processes) stop too, so the
    # unwind does not wait on them
    for pid in _children():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    raise Terminated


def unwind_on_sigterm() -> None:
    """From now on, SIGTERM raises :class:`Terminated` in the main thread (a process that only ever does one
    thing: a KFP component). Only the main thread can set a handler: elsewhere, nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` while the block runs (``sdarflow.cli.main``, which tests also call
    in-process), then the previous handler is back. Only the main thread can set a handler: elsewhere, nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set from C, which Python cannot put back
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT held back while the block runs, then delivered: for steps that must not be cut in half
    (two renames that swap a folder into place)."""
    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def run_child(cmd: Sequence[str], **popen) -> subprocess.CompletedProcess:
    """``subprocess.run`` for a child that cleans up when stopped: if this process is stopped (SIGTERM, Ctrl-C) or
    fails while waiting, the child gets SIGTERM and :data:`CHILD_GRACE_S` to exit before SIGKILL (``subprocess.run``
    sends SIGKILL at once, so the child's own cleanups never ran and torchrun's workers were orphaned)."""
    with subprocess.Popen(cmd, **popen) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(CHILD_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
            raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
