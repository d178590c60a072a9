"""Device placement with a fake CUDA device check (no GPU here): ``auto`` resolves to this rank's GPU, read-only
models and a training rank's frozen base load in bf16 straight onto it, ``--engine auto`` picks vLLM on a GPU where its GPU build is installed, training picks DeepSpeed on
a multi-GPU node; and without a GPU everything stays on the CPU in float32."""

from __future__ import annotations

import pytest
import torch

from sdarflow.errors import ConfigError
from sdarflow.models.device import inference_dtype, resolve_device
from sdarflow.rollout.engine import pick_engine
from sdarflow.train.launch import resolve_engine


@pytest.fixture
def fake_gpus(monkeypatch):
    """torch reports ``n`` CUDA devices with bf16; ``Module.to`` records where it was sent instead of moving."""
    moves: list[torch.device] = []

    def install(n: int = 2):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)

        def to(self, *args, **kwargs):
            moves.append(torch.device(args[0]) if args else kwargs.get("device"))
            return self

        monkeypatch.setattr(torch.nn.Module, "to", to)
        return moves

    return install


def test_auto_is_this_ranks_gpu_when_there_is_one(fake_gpus, monkeypatch):
    fake_gpus(2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    assert inference_dtype(resolve_device("auto")) == torch.bfloat16


def test_without_a_gpu_everything_is_cpu_float32():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == torch.device("cpu")
    assert inference_dtype(torch.device("cpu")) == torch.float32


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ("cuda", "torch sees 0 CUDA device"),
        ("cuda:3", "torch sees 0"),
        ("tpu", "is not"),
        ("mps", "not supported"),
    ],
)
def test_a_device_that_is_not_there_is_one_line(request_, message, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=message) as err:
        resolve_device(request_)
    assert "fix:" in str(err.value) and "\n" not in str(err.value)


def test_a_read_only_model_loads_in_bf16_straight_onto_the_gpu(fake_gpus, tiny_model, monkeypatch):
    """On a GPU the weights go from the files to the device (transformers' device_map), never whole through host
    memory; here the load records where it was sent and stays on the CPU."""
    from transformers import AutoModelForCausalLM

    from sdarflow.models import load_policy

    maps = []
    load = AutoModelForCausalLM.from_pretrained.__func__

    def recorded(cls, path, **kwargs):
        maps.append(kwargs.pop("device_map", None))
        return load(cls, path, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(recorded))
    fake_gpus(2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    policy = load_policy(str(tiny_model))
    assert next(policy.model.parameters()).dtype == torch.bfloat16
    assert maps[-1] == {"": torch.device("cuda", 1)}
    trainable = load_policy(str(tiny_model), trainable=True, device="cpu")
    assert next(trainable.model.parameters()).dtype == torch.float32 and maps[-1] is None


@pytest.mark.parametrize(
    ("settings", "dtype"),
    [
        ({}, torch.bfloat16),  # a LoRA's frozen base
        ({"lora_rank": 0, "engine": "deepspeed"}, torch.bfloat16),  # bf16 copies, float32 masters
        ({"lora_rank": 0, "engine": "torch"}, torch.float32),  # AdamW on bf16 weights would lose updates
        ({"precision": "fp32"}, torch.float32),
    ],
)
def test_each_training_rank_loads_its_base_onto_its_own_gpu(fake_gpus, monkeypatch, settings, dtype):
    from sdarflow.stages.train import TrainConfig, weights_placement

    fake_gpus(8)
    monkeypatch.setenv("LOCAL_RANK", "5")
    cfg = TrainConfig.from_dict({"engine": "deepspeed", **settings})
    assert weights_placement(cfg, full=cfg.lora_rank == 0) == (torch.device("cuda", 5), dtype)


@pytest.mark.parametrize("build", ["gpu", "cpu", None])
def test_engine_auto_is_vllm_only_on_a_gpu_with_vllms_gpu_build(build, monkeypatch):
    from sdarflow.rollout import engine

    monkeypatch.setattr(engine, "vllm_build", lambda: build)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert pick_engine("auto", gpu) == ("vllm" if build == "gpu" else "hf")
    # on a CPU hf: vLLM's CPU build was 0.8-1.6x as fast and starts in minutes (docs/capacity.md#generation-engines)
    assert pick_engine("auto", cpu) == "hf" and pick_engine("auto", torch.device("mps")) == "hf"
    assert pick_engine("hf", gpu) == "hf" and pick_engine("vllm", cpu) == "vllm"


def test_training_on_a_multi_gpu_node_or_as_a_launched_rank_is_deepspeed():
    assert resolve_engine("auto", device_count=8, env={}) == "deepspeed"
    assert resolve_engine("auto", device_count=1, env={}) == "torch"
    assert resolve_engine("auto", device_count=0, env={"WORLD_SIZE": "4"}) == "deepspeed"
    assert resolve_engine("torch", device_count=8, env={}) == "torch"


_MMAP_PROBE = """
import ctypes, sys
from sdarflow.models.device import pin_malloc_mmap_threshold
fields = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in fields]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
print(pin_malloc_mmap_threshold() if sys.argv[1] == "pin" else None)
libc.free(libc.malloc(8 << 20))  # glibc's dynamic threshold follows a freed mmap block: up to 8 MiB here
before = libc.mallinfo2().hblkhd
libc.malloc(2 << 20)
print(libc.mallinfo2().hblkhd - before >= 2 << 20)  # the 2 MiB block was mmapped, not carved from the heap
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33")
@pytest.mark.parametrize(
    ("mode", "env", "expected"),
    [
        ("pin", {}, ["True", "True"]),
        ("none", {}, ["None", "False"]),  # the control: without the pin, glibc serves it from the heap
        (
            "pin",
            {"MALLOC_MMAP_THRESHOLD_": "65536"},
            ["False", "True"],
        ),  # the user's setting wins, and holds too
    ],
)
def test_the_allocator_keeps_large_blocks_off_the_heap(mode, env, expected):
    import os
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _MMAP_PROBE, mode],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.split() == expected
