"""Test data factories: a synthetic rescored dataset published the way the rescore stage publishes it, adapter
weights, a fake PEFT adapter and eval reports bound to it, metrics lines, and the CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pyarrow as pa
import torch

from sdarflow import storage
from sdarflow.models.identity import BASE_FILE, adapter_folder_id
from sdarflow.schema import RESCORED_SCHEMA

# The base model fingerprint the fake eval reports record (no base model folder behind it)
FAKE_BASE_ID = "0123456789abcdef"
# What `sdarflow evaluate` records of how it evaluated, but the task count (the gate pairs only reports that
# record the same)
FAKE_PROTOCOL = {
    "temperature": 1.0,
    "max_turns": 0,
    "max_new_tokens": 32,
    "history_turns": 4,
    "prompt_format": "command",
    "first_task": 0,
    "seed": 1234,
}


def fake_adapter(folder: Path, rank: int = 8, seed: int = 0) -> Path:
    """A tiny PEFT-format LoRA adapter folder (adapter_config.json, adapter_model.safetensors) whose content is a
    function of ``rank`` and ``seed`` alone, so reports bound to one (:func:`bound`) fit every copy. Like the train
    stage's, it records its base model's fingerprint (:data:`FAKE_BASE_ID`: no folder behind it)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": "tiny-qwen2",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / BASE_FILE).write_text(json.dumps({"fingerprint": FAKE_BASE_ID}))
    generator = torch.Generator().manual_seed(seed)
    tensors = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(rank, 16, generator=generator)}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


@cache
def fake_adapter_id(rank: int = 8, seed: int = 0) -> str:
    """The adapter id (``models.identity.adapter_id``) of :func:`fake_adapter` with ``rank`` and ``seed``."""
    with tempfile.TemporaryDirectory() as tmp:
        return adapter_folder_id(fake_adapter(Path(tmp) / "a", rank, seed))


def with_report(adapter: Path, report: dict) -> tuple[Path, dict]:
    """``(adapter, report bound to it)``: ``reg.register(name, *with_report(make_adapter(seed=1), report(...)))``."""
    return adapter, bound(report, adapter)


def bound(report: dict, adapter: Path | None, base_id: str = FAKE_BASE_ID) -> dict:
    """``report`` as ``sdarflow evaluate`` records what it evaluated: ``adapter`` (None: the base model) on the
    base model with fingerprint ``base_id``."""
    return {**report, "adapter_id": adapter_folder_id(adapter) if adapter else None, "base_id": base_id}


def rescored_table(
    n_groups: int = 4,
    group_size: int = 4,
    turns: int = 2,
    prompt_len: int = 24,
    resp_len: int = 4,
    seed: int = 0,
) -> pa.Table:
    """Token ids below 500 (any smoke tokenizer has more: 259 byte and special tokens plus its merges, 663 now).
    Episodes of ``turns`` turn rows; odd episodes of each group succeed (return 1), even ones fail."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for grp in range(n_groups):
        for ep in range(group_size):
            won = ep % 2 == 1
            for turn in range(turns):
                resp = torch.randint(5, 500, (resp_len,), generator=gen).tolist()
                old = (
                    -0.3 - torch.rand(resp_len, generator=gen) * 3
                ).tolist()  # teacher's old + 0.3 stays <= 0
                rows.append(
                    {
                        "run_id": "test",
                        "round": 0,
                        "task_id": f"task-{grp}",
                        "group_id": f"g{grp}",
                        "traj_id": f"g{grp}/e{ep}",
                        "turn": turn,
                        "task_type": "cook",
                        "split": "train",
                        "prompt_token_ids": torch.randint(5, 500, (prompt_len,), generator=gen).tolist(),
                        "response_token_ids": resp,
                        "response_text": "x",
                        "rollout_logprobs": old,
                        "reward": float(won and turn == turns - 1),
                        "episode_return": float(won),
                        "success": won,
                        "format_ok": True,
                        "policy_version": "base",
                        "prompt_messages": "[]",
                        "env": "test",
                        "num_turns": turns,
                        "old_logprobs": old,
                        "teacher_logprobs": [x + 0.3 for x in old],
                        "ref_logprobs": [x - 0.2 for x in old],
                        "skill_ids": ["s1"],
                        "skill_hit": True,
                    }
                )
    return pa.Table.from_pylist(rows, schema=RESCORED_SCHEMA)


def publish_rescored(uri: str, **kwargs) -> str:
    storage.write_table(
        rescored_table(**kwargs), uri, kind="rescored", schema=RESCORED_SCHEMA, config_hash="test", inputs=[]
    )
    return uri


def adapter_weights(uri: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(uri) / "adapter_model.safetensors"))


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def metrics_lines(uri: str) -> list[dict]:
    return [json.loads(x) for x in Path(uri, "metrics.jsonl").read_text().splitlines()]


def cli(*argv: str, **kwargs) -> subprocess.Popen:
    """``sdarflow`` in a subprocess (the way a pod runs it), stdout/stderr to files next to nothing."""
    return subprocess.Popen(
        [sys.executable, "-m", "sdarflow.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def two_episodes() -> list[dict]:
    """Group a: S succeeds in 2 turns; F fails in 2, its first turn identical to S's, its second not."""
    turn = {"group_id": "a", "format_ok": True}
    return [
        {**turn, "traj_id": "S", "turn": 0, "success": True, "episode_return": 1.0,
         "prompt_token_ids": [1, 2], "response_token_ids": [7]},
        {**turn, "traj_id": "S", "turn": 1, "success": True, "episode_return": 1.0,
         "prompt_token_ids": [1, 2, 7, 3], "response_token_ids": [8]},
        {**turn, "traj_id": "F", "turn": 0, "success": False, "episode_return": 0.0,
         "prompt_token_ids": [1, 2], "response_token_ids": [7]},
        {**turn, "traj_id": "F", "turn": 1, "success": False, "episode_return": 0.0,
         "prompt_token_ids": [1, 2, 7, 3], "response_token_ids": [9]},
    ]  # fmt: skip


def reseal(folder: str | Path) -> None:
    """Record the current size and sha256 of every part in a local dataset's manifest, as a producer that wrote
    those parts would: a test can then change a part and reach the checks behind the checksum."""
    import hashlib

    folder = Path(folder)
    manifest = json.loads((folder / storage.MANIFEST).read_text())
    for entry in manifest["files"]:
        data = (folder / manifest.get("prefix", "") / entry["path"]).read_bytes()
        entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / storage.MANIFEST).write_text(json.dumps(manifest))


def dag_tasks(spec: dict) -> dict[str, dict]:
    """Every container task of a compiled pipeline spec's root DAG by name, including those inside its If/Else
    branches (the training pipeline runs its rounds in one, ``condition-*``); other sub-DAGs stay one task."""
    tasks: dict[str, dict] = {}

    def walk(level: dict) -> None:
        for name, task in level.items():
            if name.startswith("condition-"):
                walk(spec["components"][task["componentRef"]["name"]]["dag"]["tasks"])
            else:
                tasks[name] = task

    walk(spec["root"]["dag"]["tasks"])
    return tasks
