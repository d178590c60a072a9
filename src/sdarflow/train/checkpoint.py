"""Atomic checkpoints of a training run in a local folder, optionally mirrored to storage, and resuming from the
newest intact one.

``<dir>/step-00000006/`` holds ``engine/`` (weights + optimizer), one ``rng-rank<r>.pt`` per rank and, written last,
``state.json`` (counters, data cursor, LR schedule, metrics history, run fingerprint, every file's sha256). It is
written as ``step-XXXXXXXX.tmp`` and renamed when complete, so a kill never leaves a half-written folder that looks
complete. Restore skips a checkpoint whose files do not match their sums, setting it aside as ``step-N.damaged``.

With a ``mirror`` URI (``s3://`` or a folder), rank 0 also publishes each checkpoint there (``<mirror>/step-N``),
and a restore first fetches a mirrored checkpoint newer than any local one. So a retried pipeline task, on another
node with an empty disk, resumes where the killed one stopped with no volume to provision (a fresh PVC is root's,
and KFP sets no fsGroup for the images' non-root user; a zonal one pins the retry to its zone).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from sdarflow import storage
from sdarflow.errors import CheckpointError, StorageError
from sdarflow.storage import file_sha256, inside
from sdarflow.train.engine import TrainEngine
from sdarflow.train.schedule import TrainState

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
EXTRA_FILE = "extra.pt"  # rank 0's extra tensors (the EMA teacher), when the run has them
_NAME = re.compile(r"^step-(\d{8})$")


def capture_rng() -> dict:
    """Generator states as tensors and plain lists, so they load with ``torch.load(weights_only=True)``."""
    import numpy as np

    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    import numpy as np

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _on_every_rank(engine: TrainEngine, phase: Callable[[], None]) -> None:
    """Run ``phase`` on this rank, then agree: if it failed on any rank, it fails on every rank, so a rank that fails
    alone does not leave the others waiting at the next collective (until the NCCL timeout). A failure inside the
    engine's own collectives (DeepSpeed's barriers) still leaves them there: only the engine can agree on that."""
    error = None
    try:
        phase()
    except Exception as err:  # noqa: BLE001 - every failure must reach the agreement below
        error = err
    failed = engine.all_reduce_sum({"failed": float(error is not None)})["failed"]
    if error is not None:
        raise error
    if failed:
        raise OSError(errno.EIO, f"{int(failed)} other rank(s) could not write their part")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpoints:
    """The checkpoints of one run. ``fingerprint`` identifies the run's settings and inputs: resuming from a
    folder written with other settings would silently mix two experiments, so it is refused."""

    def __init__(self, root: str | Path, fingerprint: str, keep: int = 2, mirror: str = "") -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.keep = max(1, keep)
        self.mirror = mirror
        self.restored_extra: dict[str, torch.Tensor] | None = None  # what restore() found beside the state

    def complete(self) -> list[tuple[int, Path]]:
        """(step, folder) of every complete checkpoint, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()
        )

    def save(
        self, engine: TrainEngine, state: TrainState, meta: dict, extra: dict[str, torch.Tensor] | None = None
    ) -> Path:
        """Write the checkpoint of ``state.step`` (collective: every rank calls it), with rank 0's ``extra``
        tensors (the EMA teacher) if given. A failed write (a full disk) removes the partial folder and raises
        CheckpointError: the checkpoints before it stay as they were."""
        final = self.root / f"step-{state.step:08d}"
        tmp = final.with_name(final.name + ".tmp")

        def make_tmp() -> None:
            if engine.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)

        def write_parts() -> None:
            engine.save(tmp / "engine")
            torch.save(capture_rng(), tmp / f"rng-rank{engine.rank}.pt")
            if extra is not None and engine.rank == 0:
                torch.save(extra, tmp / EXTRA_FILE)

        def commit() -> None:
            if engine.rank != 0:
                return
            body = {
                "fingerprint": self.fingerprint,
                "engine": engine.name,
                **meta,
                "state": state.to_dict(),
                # verified on restore: a corrupted file falls back to the checkpoint before
                "files": _sums(tmp),
            }
            with (tmp / STATE_FILE).open("w") as f:
                json.dump(body, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            shutil.rmtree(final, ignore_errors=True)  # only after a crash between rename and prune
            tmp.rename(final)  # atomic: the checkpoint appears complete or not at all
            _fsync_dir(self.root)
            for _, old in self.complete()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
            log.info("checkpoint: step %d -> %s", state.step, final)
            if self.mirror:
                self._upload(final)

        try:
            for phase in (make_tmp, write_parts, commit):
                _on_every_rank(engine, phase)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            # torch.save reports a failed write as RuntimeError
            if not isinstance(err, (OSError, RuntimeError)):
                raise
            reason = getattr(err, "strerror", None) or str(err).strip().splitlines()[0]
            raise CheckpointError(
                f"cannot write checkpoint {final}: {reason}; fix: free space in {self.root} or pass "
                f"a --checkpoint-dir on a larger volume (the run resumes from the last complete checkpoint)"
            ) from err
        return final

    def _mirrored(self) -> list[tuple[int, str]]:
        """(step, URI) of every checkpoint published in the mirror, oldest first."""
        found = [(int(m.group(1)), n) for n in storage.children(self.mirror) if (m := _NAME.match(n))]
        return [(step, storage.join(self.mirror, n)) for step, n in sorted(found)]

    def _upload(self, final: Path) -> None:
        """Publish ``final`` to the mirror and prune the mirror to ``keep``. A failure (an S3 outage) costs only
        this checkpoint's copy there: a warning, and training goes on with the local one."""
        try:
            storage.publish_dir(
                final, storage.join(self.mirror, final.name), kind="checkpoint", overwrite=True
            )
            for _, uri in self._mirrored()[: -self.keep]:
                storage.delete_tree(uri)
        except (StorageError, OSError) as err:
            reason = str(err).splitlines()[0]
            log.warning(
                "checkpoint: could not copy %s to %s (%s); a retry resumes from an older one",
                final,
                self.mirror,
                reason,
            )
            return
        log.info("checkpoint: %s -> %s", final.name, self.mirror)

    def _download(self) -> None:
        """Fetch the newest mirrored checkpoint newer than every local one (a retried task on an empty disk);
        one that cannot be fetched is skipped with a warning for the one before."""
        local = max((step for step, _ in self.complete()), default=-1)
        for step, uri in reversed(self._mirrored()):
            if step <= local:
                return
            tmp = self.root / f"step-{step:08d}.tmp"
            try:
                storage.fetch_dir(uri, kind="checkpoint", dest=tmp)
            except (StorageError, OSError) as err:
                shutil.rmtree(tmp, ignore_errors=True)
                log.warning(
                    "checkpoint: cannot fetch %s (%s); trying the one before", uri, str(err).splitlines()[0]
                )
                continue
            tmp.rename(self.root / f"step-{step:08d}")
            log.info("checkpoint: fetched %s", uri)
            return

    def restore(self, engine: TrainEngine) -> TrainState | None:
        """Load the newest complete checkpoint (fetched from the mirror when it is newer) into ``engine`` and the
        RNGs; None when there is none."""
        if engine.rank == 0 and self.root.is_dir():
            for stale in self.root.glob("step-*.tmp"):
                log.info("checkpoint: removing incomplete %s", stale)
                shutil.rmtree(stale, ignore_errors=True)
        if engine.rank == 0 and self.mirror:
            self.root.mkdir(parents=True, exist_ok=True)
            self._download()
        engine.barrier()
        found = self._newest_intact(set_aside=engine.rank == 0)
        if found is None:
            return None
        path, body = found
        if body.get("fingerprint") != self.fingerprint:
            raise CheckpointError(
                f"checkpoint '{path}' was written by a run with other settings or inputs "
                f"(fingerprint {body.get('fingerprint')} != {self.fingerprint}); "
                f"fix: rerun with the same settings, or pass a new --checkpoint-dir"
            )
        if body.get("engine") != engine.name:
            raise CheckpointError(
                f"checkpoint '{path}' was written by engine {body.get('engine')!r}, this run uses "
                f"{engine.name!r}; fix: pass --engine {body.get('engine')} or a new --checkpoint-dir"
            )
        engine.load(path / "engine")
        rng_file = path / f"rng-rank{engine.rank}.pt"
        if rng_file.is_file():
            restore_rng(torch.load(rng_file, weights_only=True))
        else:
            log.warning("checkpoint %s has no RNG state for rank %d (world size changed?)", path, engine.rank)
        state = TrainState.from_dict(body["state"])
        self.restored_extra = (
            torch.load(path / EXTRA_FILE, weights_only=True) if (path / EXTRA_FILE).is_file() else None
        )
        log.info("resuming from %s at step %d", path, state.step)
        return state

    def _newest_intact(self, set_aside: bool) -> tuple[Path, dict] | None:
        """The newest checkpoint whose files match the sha256 sums in its state.json, with that state; a damaged
        one is skipped with one line and (``set_aside``, rank 0) renamed ``step-N.damaged``, so it is kept for a
        look but no longer counts among the checkpoints pruning keeps. CheckpointError when every one is damaged."""
        done = self.complete()
        for _, path in reversed(done):
            try:
                body = json.loads((path / STATE_FILE).read_text())
                problem = "" if isinstance(body, dict) else "state.json is not an object"
            except (OSError, ValueError, RecursionError) as err:  # ValueError: not JSON, or not UTF-8
                body, problem = {}, f"state.json is unreadable ({type(err).__name__})"
            if not problem:
                problem = next((f"{rel} {why}" for rel, why in _mismatches(path, body.get("files"))), "")
            if not problem:
                problem = _state_problem(body.get("state"))
            if not problem:
                return path, body
            log.warning("checkpoint %s is damaged (%s); trying the one before", path, problem)
            if set_aside:
                _set_aside(path)
        if done:
            raise CheckpointError(
                f"every checkpoint in '{self.root}' is damaged (see the warnings above); fix: delete the folder to "
                f"train from the start"
            )
        return None


def _state_problem(state: object) -> str:
    """Why a recorded training state cannot be resumed from ("" when it can)."""
    try:
        parsed = TrainState.from_dict(state)  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as err:
        return f"state.json holds no training state ({type(err).__name__}: {err})"
    if min(parsed.step, parsed.rl_steps, parsed.sft_steps, parsed.nonfinite_in_row) < 0:
        return "state.json holds negative step counters"
    return ""


def _set_aside(path: Path) -> None:
    """Rename a damaged checkpoint ``step-N.damaged`` (replacing an older one of that name, whatever it is)."""
    target = path.with_name(path.name + ".damaged")
    try:
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        path.rename(target)
    except OSError as err:  # it stays where it is; it is skipped again next time
        log.warning("checkpoint %s could not be set aside (%s)", path, err)


def _sums(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _mismatches(folder: Path, sums: object):
    """(file, what is wrong) for every recorded file that is missing or changed."""
    if not isinstance(sums, dict):
        yield STATE_FILE, "has no file list"
        return
    for rel, expected in sums.items():
        try:
            path = inside(folder, rel, f"checkpoint {folder}")
        except StorageError as err:
            yield rel, str(err)
            continue
        if not path.is_file():
            yield rel, "is missing"
        elif file_sha256(path) != expected:
            yield rel, "does not match its sha256"


def checkpointing(cfg, engine: TrainEngine, data, schedule, ema=None):
    """(state restored from the train config's ``checkpoint_dir`` or None, the trainer's on_checkpoint callback or
    None without a folder); ``data`` and ``schedule`` are the run's, for the saved cursor. ``ema``
    (:class:`~sdarflow.extensions.ema.EmaWeights`) is saved with every checkpoint and restored with the state."""
    if not cfg.checkpoint_dir:
        return None, None
    checkpoints = Checkpoints(
        cfg.checkpoint_dir, cfg.resume_fingerprint(), cfg.keep_checkpoints, cfg.checkpoint_uri
    )

    def save(state) -> None:
        batches = [min(cfg.mini_batches, len(rows)) for rows in (data.samples, data.sft_pairs)]
        meta = {
            "cursor": state.cursor(*batches),
            "schedule": schedule.state_dict(),
            "config_hash": cfg.config_hash(),
        }
        checkpoints.save(engine, state, meta, ema.average if ema else None)

    state = checkpoints.restore(engine)
    if ema is not None and checkpoints.restored_extra is not None:
        ema.average = checkpoints.restored_extra
    return state, save
