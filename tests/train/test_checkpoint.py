"""Checkpoints: atomic folders, newest-complete selection, refusal of another run's folder, RNG round trip, and an
in-process crash + resume that ends with the same weights as an uninterrupted run (torch engine)."""

from __future__ import annotations

import errno
import queue
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from factories import rescored_table

from sdarflow.errors import CheckpointError
from sdarflow.models import load_policy
from sdarflow.models.policy import new_lora
from sdarflow.train.checkpoint import Checkpoints, capture_rng, restore_rng
from sdarflow.train.engine import make_engine
from sdarflow.train.samples import make_samples
from sdarflow.train.schedule import TrainState, WarmupConstant
from sdarflow.train.sft import sft_pairs_from_rows
from sdarflow.train.trainer import TrainData, TrainLoop, train


class Crash(Exception):
    pass


def setup(tiny_model):
    policy = load_policy(str(tiny_model), trainable=True)
    torch.manual_seed(0)
    model = new_lora(policy.model, 4, 8, ["q_proj", "v_proj"])
    engine = make_engine("torch", model, lr=1e-2, max_grad_norm=1.0)
    rows = rescored_table(n_groups=2, group_size=4, prompt_len=12).to_pylist()
    data = TrainData(make_samples(rows), sft_pairs_from_rows(rows), policy.tokenizer.pad_token_id)
    return model, engine, data


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_crash_and_resume_equals_an_uninterrupted_run(tiny_model, tmp_path):
    hp = TrainLoop(method="sdar", mini_batches=2, max_steps=6, save_every=2, sft_ratio=0.5, seed=3)
    schedule = WarmupConstant(1e-2, warmup_steps=3)

    model, engine, data = setup(tiny_model)
    reference = train(engine, data, hp, schedule)
    expected = weights(model)

    ckpt = Checkpoints(tmp_path / "ck", "run-a")
    model, engine, data = setup(tiny_model)

    def crash_at_step_3(record: dict) -> None:
        if record["step"] == 3:
            raise Crash

    with pytest.raises(Crash):
        train(
            engine,
            data,
            hp,
            schedule,
            on_step=crash_at_step_3,
            on_checkpoint=lambda s: ckpt.save(engine, s, {}),
        )
    assert [s for s, _ in ckpt.complete()] == [2]

    model, engine, data = setup(tiny_model)
    state = ckpt.restore(engine)
    assert state.step == 2 and len(state.history) == 2
    resumed = train(engine, data, hp, schedule, state=state, on_checkpoint=lambda s: ckpt.save(engine, s, {}))
    got = weights(model)
    assert max(float((got[n] - expected[n]).abs().max()) for n in got) == 0.0
    assert [h["kind"] for h in resumed.history] == [h["kind"] for h in reference.history]
    assert [h["loss/total"] for h in resumed.history] == [h["loss/total"] for h in reference.history]
    assert [s for s, _ in ckpt.complete()] == [4, 6]  # keep=2 prunes the oldest


class FakeEngine:
    """Enough of the engine interface for the checkpoint folder logic."""

    name = "torch"
    rank = 0
    world_size = 1

    def __init__(self) -> None:
        self.loaded = None

    def save(self, path):
        path.mkdir(parents=True)
        (path / "w").write_text("x")

    def load(self, path):
        self.loaded = path

    def barrier(self):
        pass

    def all_reduce_sum(self, values):
        return values


class GlooEngine(FakeEngine):
    """FakeEngine on one rank of a real (gloo) process group; ``fail_rank`` cannot write its engine files."""

    def __init__(self, fail_rank: int, error: Exception | None = None) -> None:
        super().__init__()
        self.rank, self.world_size, self.fail_rank = dist.get_rank(), dist.get_world_size(), fail_rank
        self.error = error or OSError(errno.ENOSPC, "No space left on device")

    def save(self, path):
        if self.rank == self.fail_rank:
            raise self.error
        path.mkdir(parents=True, exist_ok=True)
        (path / f"w{self.rank}").write_text("x")

    def barrier(self):
        dist.barrier()

    def all_reduce_sum(self, values):
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist()))


def _save_on_two_ranks(rank: int, root: str, port: int, fail_rank: int, error, results, done) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ckpt = Checkpoints(root, "fp")
    try:
        ckpt.save(GlooEngine(fail_rank=-1), TrainState(step=2), {})
        try:
            ckpt.save(GlooEngine(fail_rank, error), TrainState(step=4), {})
            results.put((rank, "saved"))
        except Exception as err:  # noqa: BLE001 - the test reports what each rank raised
            results.put((rank, f"{type(err).__name__}: {err}"))
        # A failed rank stays in the group, as a NCCL rank does (gloo would see a peer's exit, NCCL does not).
        done.wait(60)
    finally:
        dist.destroy_process_group()


def test_incomplete_folders_are_ignored_and_removed(tmp_path):
    ckpt = Checkpoints(tmp_path, "fp")
    engine = FakeEngine()
    ckpt.save(engine, TrainState(step=2), {})
    (tmp_path / "step-00000004.tmp").mkdir()  # killed while writing
    (tmp_path / "step-00000006").mkdir()  # no state.json: not complete either
    assert ckpt.restore(engine).step == 2
    assert engine.loaded == tmp_path / "step-00000002" / "engine"
    assert not (tmp_path / "step-00000004.tmp").exists()


def test_another_runs_checkpoint_is_refused(tmp_path):
    engine = FakeEngine()
    Checkpoints(tmp_path, "settings-a").save(engine, TrainState(step=2), {})
    with pytest.raises(CheckpointError, match="other settings or inputs.*new --checkpoint-dir"):
        Checkpoints(tmp_path, "settings-b").restore(engine)
    engine.name = "deepspeed"
    with pytest.raises(CheckpointError, match="engine 'torch'.*--engine torch"):
        Checkpoints(tmp_path, "settings-a").restore(engine)
    assert Checkpoints(tmp_path / "empty", "x").restore(FakeEngine()) is None


def test_a_damaged_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    """Every file's sha256 is in state.json: a corrupted or missing file, or a listed path outside the checkpoint,
    makes restore use the previous complete checkpoint with one warning; when all are damaged it stops."""
    import json

    ckpt, engine = Checkpoints(tmp_path, "fp", keep=3), FakeEngine()
    for step in (2, 4, 6):
        ckpt.save(engine, TrainState(step=step), {})
    (tmp_path / "step-00000006" / "engine" / "w").write_text("flipped bits")
    state = tmp_path / "step-00000004" / "state.json"
    body = json.loads(state.read_text())
    state.write_text(json.dumps({**body, "files": {**body["files"], "../step-00000002/engine/w": "0" * 64}}))
    with caplog.at_level("WARNING"):
        assert ckpt.restore(engine).step == 2
    assert engine.loaded == tmp_path / "step-00000002" / "engine"
    assert "step-00000006 is damaged (engine/w does not match its sha256)" in caplog.text
    assert (
        "step-00000004 is damaged (../step-00000002/engine/w" in caplog.text
        and "leaves its folder" in caplog.text
    )
    # set aside, so pruning keeps counting only good checkpoints
    assert [step for step, _ in ckpt.complete()] == [2] and (tmp_path / "step-00000006.damaged").is_dir()
    (tmp_path / "step-00000002" / "rng-rank0.pt").unlink()
    with pytest.raises(CheckpointError, match="every checkpoint in .* is damaged.*fix: delete the folder"):
        ckpt.restore(engine)


def test_a_full_disk_is_one_line_and_keeps_the_checkpoints_before(tmp_path):
    """The write limit (RLIMIT_FSIZE) makes every write past 1 KiB fail, as a full disk does."""
    import resource
    import signal

    ckpt, engine = Checkpoints(tmp_path, "fp"), FakeEngine()
    ckpt.save(engine, TrainState(step=2), {})
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        with pytest.raises(CheckpointError) as err:
            ckpt.save(engine, TrainState(step=4), {})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert "cannot write checkpoint" in str(err.value) and "step-00000004" in str(err.value)
    assert "fix: free space" in str(err.value) and "\n" not in str(err.value)
    assert [step for step, _ in ckpt.complete()] == [2] and not (tmp_path / "step-00000004.tmp").exists()
    assert ckpt.restore(engine).step == 2


def test_a_retry_on_an_empty_disk_resumes_from_the_mirror(tmp_path, s3_root, caplog):
    """Each checkpoint is published to the mirror (S3, moto) and pruned there as locally; a restore on another
    node's empty disk fetches the newest, a damaged one falls back to the one before, and a mirror that cannot be
    written costs only its copy there."""
    from sdarflow import storage

    mirror = storage.join(s3_root, "ck")
    pod_a, engine = Checkpoints(tmp_path / "node-a", "fp", keep=2, mirror=mirror), FakeEngine()
    for step in (2, 4, 6):
        pod_a.save(engine, TrainState(step=step), {})
    assert storage.children(mirror) == ["step-00000004", "step-00000006"]

    pod_b = Checkpoints(tmp_path / "node-b", "fp", mirror=mirror)
    assert pod_b.restore(engine).step == 6
    assert engine.loaded == tmp_path / "node-b" / "step-00000006" / "engine"
    assert pod_b.restore(engine).step == 6  # nothing newer in the mirror: nothing fetched again

    storage.write_bytes(storage.join(mirror, "step-00000006", "engine", "w"), b"flipped bits")
    with caplog.at_level("WARNING"):
        assert Checkpoints(tmp_path / "node-c", "fp", mirror=mirror).restore(engine).step == 4
    assert "cannot fetch" in caplog.text and "step-00000006" in caplog.text
    assert not list((tmp_path / "node-c").glob("*.tmp"))

    caplog.clear()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the mirror should be")
    with caplog.at_level("WARNING"):
        Checkpoints(tmp_path / "node-d", "fp", mirror=str(blocked)).save(engine, TrainState(step=2), {})
    assert "could not copy" in caplog.text and (tmp_path / "node-d" / "step-00000002").is_dir()


def test_rng_states_round_trip():
    import numpy as np

    state = capture_rng()
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng(torch.load(_save(state), weights_only=True))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == a


def _save(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    ("fail_rank", "error", "seen"),
    [
        (0, None, "CheckpointError: cannot write checkpoint"),
        (1, None, "CheckpointError: cannot write checkpoint"),
        (
            1,
            ValueError("the engine refused"),
            "ValueError: the engine refused",
        ),  # not a write error: raised as is
    ],
)
def test_a_write_that_fails_on_one_rank_fails_on_every_rank_without_a_hang(tmp_path, fail_rank, error, seen):
    """Two real ranks (gloo): when one cannot write its part, both raise the one-line CheckpointError instead of the
    healthy rank waiting at the next collective forever, and the checkpoint before stays the newest."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_save_on_two_ranks, args=(r, str(tmp_path), port, fail_rank, error, results, done))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=45) for _ in procs)
    except queue.Empty:
        got = None
    done.set()
    for p in procs:
        p.join(timeout=30)
        p.kill()
    assert got is not None, "a rank hung at a collective after the other failed"
    assert got[fail_rank].startswith(seen)
    assert got[1 - fail_rank].startswith("CheckpointError: cannot write checkpoint")
    assert "other rank(s) could not write their part" in got[1 - fail_rank]
    assert all("\n" not in m for m in got.values())
    assert [step for step, _ in Checkpoints(tmp_path, "fp").complete()] == [2]


@pytest.mark.parametrize(
    "edit",
    [
        lambda body: body.update(state=5),
        lambda body: body.pop("state"),
        lambda body: body["state"].update(step="abc"),
        lambda body: body["state"].update(step=-5),
        lambda body: body.pop("files"),  # an unlisted file could be anything: no file list, no trust
    ],
)
def test_a_checkpoint_whose_state_is_not_a_training_state_falls_back(tmp_path, edit):
    import json

    ckpt, engine = Checkpoints(tmp_path, "fp", keep=3), FakeEngine()
    for step in (2, 4):
        ckpt.save(engine, TrainState(step=step), {})
    state = tmp_path / "step-00000004" / "state.json"
    body = json.loads(state.read_text())
    edit(body)
    state.write_text(json.dumps(body))
    (tmp_path / "step-00000004.damaged").write_text("a file where the set-aside folder goes")
    assert ckpt.restore(engine).step == 2
    assert (tmp_path / "step-00000004.damaged").is_dir()
