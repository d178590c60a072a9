"""Stopping cleanly (``sdarflow.stopping``): a process stopped with SIGTERM unwinds, the children it waits on get
SIGTERM and time to unwind too, and a swap that must not be cut in half takes the signal after it. Each case runs
in a process of its own, stopped from outside, as Kubernetes stops a pod."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# a child that, stopped by SIGTERM, records it and exits 0 (a cleanup that ran); told to start, it says so and sleeps
CHILD = """
import pathlib, signal, sys, time
def cleanup(*_):
    pathlib.Path(sys.argv[1], "child-cleaned-up").write_text("")
    sys.exit(0)
signal.signal(signal.SIGTERM, cleanup)
pathlib.Path(sys.argv[1], "child-ready").write_text("")
time.sleep(120)
"""


def _stopped(tmp_path: Path, parent: str) -> tuple[int, float]:
    """Run ``parent`` (its code sees ``CHILD``, ``folder`` and ``sys``), SIGTERM it once its child is ready; its
    exit code and the seconds it took to exit."""
    code = f"import sys\nCHILD = {CHILD!r}\nfolder = {str(tmp_path)!r}\n" + textwrap.dedent(parent)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "child-ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "child-ready").exists(), "the child never started"
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=60), time.monotonic() - start
    finally:
        proc.kill()


def test_a_stopped_parent_gives_the_child_it_runs_sigterm_and_time_to_clean_up(tmp_path):
    """``subprocess.run`` answered an exception with SIGKILL: the warm start's train child and torchrun (whose
    workers then kept training) never ran their cleanups."""
    code, _ = _stopped(
        tmp_path,
        """
        from sdarflow import stopping
        with stopping.sigterm_unwinds():
            try:
                stopping.run_child([sys.executable, "-c", CHILD, folder])
            except stopping.Terminated:
                sys.exit(143)
        """,
    )
    assert code == 143 and (tmp_path / "child-cleaned-up").exists()


@pytest.mark.parametrize("wrapper", ["", "sh -c '\"$@\"; true' sh "], ids=["direct", "under a shell"])
def test_a_child_started_by_code_that_is_not_ours_is_stopped_too(tmp_path, wrapper):
    """The KFP local runner (``sdarflow demo``) waits for its component process whatever the exception, so a
    stopped demo hung until the component finished (here: 120 s): the child now gets the SIGTERM as well, also
    under the shell the runner starts it with (a shell passes no signal on)."""
    code, seconds = _stopped(
        tmp_path,
        f"""
        import shlex, subprocess
        from sdarflow import stopping
        with stopping.sigterm_unwinds():
            try:
                with subprocess.Popen([*shlex.split({wrapper!r}), sys.executable, "-c", CHILD, folder]) as child:
                    child.wait()
            except stopping.Terminated:
                sys.exit(143)
        """,
    )
    assert code == 143 and (tmp_path / "child-cleaned-up").exists() and seconds < 30


def test_a_stop_during_a_swap_is_taken_after_it_and_a_second_stop_does_not_cut_the_unwind(tmp_path):
    """With a thread alive (torch's and Arrow's pools are), a signal mask held nothing back: the kernel handed the
    signal to the other thread and the main thread acted on it between the two renames."""
    code = f"""
import os, pathlib, signal, sys, threading, time
from sdarflow import stopping
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
log = pathlib.Path({str(tmp_path)!r}, "log")
with stopping.sigterm_unwinds():
    try:
        with stopping.signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            log.write_text("swapped\\n")  # the signal waits for the block
        log.write_text("never\\n")
    except stopping.Terminated:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # ignored while unwinding
            time.sleep(0.2)
            with log.open("a") as f:
                f.write("unwound\\n")
        except stopping.Terminated:
            pass
        sys.exit(143)
"""
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 143
    assert (tmp_path / "log").read_text() == "swapped\nunwound\n"


def test_a_folder_swap_stopped_midway_completes_and_leaves_only_the_new_folder(tmp_path):
    """A stop held back during build-model's swap was taken after it, skipping the removal of the old folder: a
    whole old model stayed behind in a hidden ``.replaced`` folder."""
    code = f"""
import os, pathlib, signal, sys
from sdarflow import stopping, storage
rename = pathlib.Path.rename
def stopped_rename(self, target):  # SIGTERM arrives during the first rename of the swap
    os.kill(os.getpid(), signal.SIGTERM)
    return rename(self, target)
out = pathlib.Path({str(tmp_path)!r}, "out")
out.mkdir()
(out / "own.json").write_text("old")
with stopping.sigterm_unwinds():
    try:
        with storage.replacing_folder(out, "own.json", "test") as staged:
            (staged / "own.json").write_text("new")
            pathlib.Path.rename = stopped_rename
    except stopping.Terminated:
        sys.exit(143)
"""
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 143
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (
        tmp_path / "out" / "own.json"
    ).read_text() == "new"


def test_a_component_process_unwinds_on_sigterm(tmp_path):
    """KFP runs a component through its own executor, not ``sdarflow.cli``: each component's entry point sets the
    handler up (``kfp_runtime.setup_component``)."""
    code = f"""
import os, pathlib, signal
from sdarflow import stopping
from sdarflow.kfp_runtime import setup_component
setup_component()
try:
    os.kill(os.getpid(), signal.SIGTERM)
except stopping.Terminated:
    pathlib.Path({str(tmp_path)!r}, "unwound").write_text("")
"""
    subprocess.run([sys.executable, "-c", code], timeout=120, check=True)
    assert (tmp_path / "unwound").exists()
