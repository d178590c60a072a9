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
    """The processes to pass a SIGTERM on to: this process's children and, for a child that is a shell, the shell's
    own children (``sh -c '...; python ...'``, how the KFP local runner starts a component, does not pass signals on
    and does not exec its last command). Linux: read from /proc; elsewhere none are found."""
    parent, name = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            head, _, tail = stat.read_bytes().rpartition(b")")  # the command name may hold spaces and ')'
            pid = int(stat.parent.name)
            parent[pid], name[pid] = int(tail.split()[1]), head.partition(b"(")[2]  # state, then the parent
    mine = [pid for pid, ppid in parent.items() if ppid == os.getpid()]
    shells = {pid for pid in mine if name[pid] in (b"sh", b"dash", b"bash")}
    return mine + [pid for pid, ppid in parent.items() if ppid in shells]


def _ignore(signum: int, frame: object) -> None:
    """A repeated SIGTERM while unwinding: nothing (a handler, not SIG_IGN, which a child started meanwhile would
    inherit across exec)."""


def _terminate(signum: int, frame: object) -> None:
    # once: a second SIGTERM during the unwind would interrupt the cleanups it runs
    signal.signal(signal.SIGTERM, _ignore)
    # children stop too, so the unwind does not wait on them (the KFP local runner's component processes)
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
    """SIGTERM and SIGINT held back while the block runs, then acted on: for steps that must not be cut in half
    (two renames that swap a folder into place). Held at the Python level: a signal mask would hold them in this
    thread only, and the kernel would hand them to another (a torch or Arrow pool thread), whose flag the main
    thread then acts on anyway. Python runs handlers in the main thread only: elsewhere, nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda n, f: got.append(n)) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(got):
            signal.raise_signal(sig)  # the handler now in place acts on it (raises, or ignores a repeat)


def run_child(cmd: Sequence[str], **popen) -> subprocess.CompletedProcess:
    """``subprocess.run`` for a child that cleans up when stopped (``subprocess.run`` sends SIGKILL at once, so the
    child's cleanups never ran and torchrun's workers were orphaned): if this process is stopped or fails while
    waiting, the child gets SIGTERM (unless the stop reached it already: SIGTERM is passed on, and Ctrl-C goes to
    the terminal's whole process group) and :data:`CHILD_GRACE_S` to exit, its output still read, before SIGKILL."""
    with subprocess.Popen(cmd, **popen) as proc:
        try:
            out, err = proc.communicate()
        except BaseException as stop:
            if proc.poll() is None and not isinstance(stop, Terminated | KeyboardInterrupt):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=CHILD_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
