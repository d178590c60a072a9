"""The run sizes ``--preset`` picks for ``sdarflow demo`` and ``sdarflow study`` (and the tests and benchmarks): the
tiny base model's recipe and the pipeline's tasks, samples and per-stage settings; and the parameter defaults
``sdarflow pipeline compile --preset`` writes into the KFP UI (``PIPELINE_PRESETS``: those sizes, and
``production`` and ``reference``)."""

from __future__ import annotations

from pathlib import Path

from sdarflow.errors import ConfigError
from sdarflow.train.warmstart import BaseModelSpec, build_base_model

_DEMO_MODEL = BaseModelSpec()
_RL_SETTINGS = {
    # RL plays games the SFT never saw, so a gain is one that carries over to new games
    "generate": {"first_task": _DEMO_MODEL.tasks},
}
# the tiny from-scratch model needs a larger step than a pretrained LLM's LoRA (5e-4 left the sampled tokens
# unchanged; 5e-3 x 16 steps per round lowered held-out pass@1)
_RL_TRAIN = {"lr": 2e-3, "train_steps": 8}

# `demo` fits ~15 minutes on 2 cores; `smoke` exercises every stage in about a minute (tests); `gpu` is for
# one GPU machine with `sdarflow[gpu]` installed (vLLM generates and evaluates on the GPU, train runs on CUDA).
SIZES: dict[str, dict] = {
    "demo": {
        # The default recipe: 500 SFT steps take ~3.5 minutes on 2 idle cores. The limit only turns a far too slow
        # machine into a clear error; it never shortens the SFT, so the demo's model is the same on every machine.
        "model": _DEMO_MODEL,
        "sft_time_limit_s": 1800.0,
        "pipeline": {
            # 24 new games per round (8 reached no held-out gain; the same 8 each round were memorized), 8 samples
            "tasks": 24,
            "group_size": 8,
            "max_turns": 0,
            # 32 tasks x 4 samples per split: pass@1's 95% interval is about +-0.08 at 0.15 (4 x 4 gave +-0.2).
            "eval_tasks": 32,
            "eval_samples": 4,
            **_RL_TRAIN,
            "stage_settings": _RL_SETTINGS,
        },
    },
    "gpu": {
        "model": _DEMO_MODEL,
        "sft_time_limit_s": 1800.0,
        "pipeline": {
            # 4x the demo's rollouts per round; 128 tasks x 8 samples narrow pass@1's interval to about +-0.04
            "tasks": 96,
            "group_size": 8,
            "max_turns": 0,
            "eval_tasks": 128,
            "eval_samples": 8,
            **_RL_TRAIN,
            "rollout_engine": "vllm",
            "stage_settings": _RL_SETTINGS,
        },
    },
    # A pretrained ~135M instruct model (`--base-model smollm2-135m-instruct`) on 2 CPU cores, in the reference
    # prompt format: no model to build; an SFT warm start on the env's expert walkthroughs first (the raw model
    # answers in prose: every reply a format error, so RL would have no success to learn from), then RL on tasks
    # the warm start never saw. Generation and training of a 135M model are ~100x the tiny model's cost per token.
    "pretrained": {
        "model": None,
        "warm_start": {
            "tasks": 32,
            "train": {"epochs": 2, "mini_batches": 4, "lr": 1e-3, "micro_batch_tokens": 4096},
        },
        "pipeline": {
            "env": "search-qa",
            "tasks": 8,
            "group_size": 4,
            "max_turns": 0,
            "eval_tasks": 8,
            "eval_samples": 2,
            "lr": 2e-4,
            "train_steps": 2,
            "stage_settings": {"generate": {"first_task": 32}, "train": {"micro_batch_tokens": 4096}},
        },
    },
    "smoke": {
        "model": BaseModelSpec(tasks=3, sft_steps=10),
        "sft_time_limit_s": 600.0,
        "pipeline": {
            "tasks": 2,
            "group_size": 2,
            "max_turns": 3,
            "eval_tasks": 1,
            "eval_samples": 2,
            "train_steps": 1,
            "stage_settings": {},
        },
    },
}


def _reference_step(
    env: str, tasks: int, max_turns: int, history_turns: int, seed_skills: str = "", **stages: dict
) -> dict:
    """A round that is one training step of an SDAR reference script on ``env``, with its LoRA recipe (the optimizer
    carried across rounds as one run); held-out tasks get 4 samples for the gate's pass@k (the reference samples
    each once). ``seed_skills``: round 0's library (``reference``: the reference's own); ``stages``: more settings."""
    rollout = {"max_new_tokens": 512, "history_turns": history_turns}
    return {
        "env": env,
        "seed_skills": seed_skills,
        "tasks": tasks,
        "group_size": 8,
        "max_turns": max_turns,
        "eval_tasks": 128,
        "eval_samples": 4,
        "lr": 3e-6,
        "lora_rank": 64,
        "train_steps": 2,
        "rollout_engine": "vllm",
        "train_engine": "deepspeed",
        "stage_settings": {
            "generate": dict(rollout),
            "evaluate": dict(rollout),
            **stages,
            "train": {"lora_alpha": 64, "weight_decay": 0.01, "carry_optimizer": True},
        },
    }


# The training pipeline's parameter defaults per `pipeline compile --preset`. `production`: a 7B instruct model's
# LoRA on 8 GPUs (vLLM rollouts, DeepSpeed training), as the SDAR reference trains ALFWorld
# (examples/grpo_trainer/run_alfworld_7b.sh: 16 tasks x group 8 per step on 8 GPUs; its LoRA run,
# examples/gigpo_trainer/run_alfworld_lora.sh: rank 64, alpha 64, lr 3e-6): a round plays 128 tasks x 8, eight of
# the reference's steps, with one optimizer step per 16 tasks' groups. Evaluation on 256 tasks x 8 samples: the
# gate's paired bound narrows with the square root of the tasks: 8x the demo's 32 narrows it sqrt(8) = 2.8 times.
PIPELINE_PRESETS: dict[str, dict] = {
    **{name: size["pipeline"] for name, size in SIZES.items()},
    "production": {
        "tasks": 128,
        "group_size": 8,
        "max_turns": 0,
        "eval_tasks": 256,
        "eval_samples": 8,
        "lr": 3e-6,
        "lora_rank": 64,
        "train_steps": 8,
        "rollout_engine": "vllm",
        "train_engine": "deepspeed",
        "stage_settings": {"train": {"lora_alpha": 64}},
    },
    # The reference's own step as a round (examples/gigpo_trainer/run_alfworld_lora.sh with GRPO, and verl's
    # defaults it leaves as they are, verl/trainer/config/ppo_trainer.yaml): 16 tasks x 8 fresh rollouts, one
    # epoch in mini-batches of 256 x 8 turn rows (about 2 for ALFWorld's episodes), one AdamW for the whole run
    # (carried from round to round with the adapter) at 3e-6 with weight decay 0.01 on a rank-64 LoRA, 50 turns of
    # up to 512 response tokens, the last 2 observations and actions in the prompt, 128 held-out tasks at
    # temperature 0.4; `pipeline compile --rounds 150` for its 150 steps. For the ALFWorld family.
    "reference": _reference_step("textworld-cooking", tasks=16, max_turns=50, history_turns=2),
    # The same for the search family (search-qa), from the reference's search script
    # (examples/grpo_opsd_trainer/run_search_7b.sh): 128 questions x 8 a step, at most 4 turns with the last 4 in
    # the prompt, 4096-token prompts (the teacher's too), mini-batches of 256 x 8 turn rows (1,024 episodes of 2-4
    # turns: 2 steps), train on 4 GPUs; the LoRA settings are the ALFWorld LoRA script's (the reference has no
    # search LoRA script; its full fine-tune runs at 1e-6). It validates greedily on 512 questions; search-qa holds
    # 192 test and 144 ood questions, so 128 of each, sampled at 0.4 for pass@k. Its skill library is the
    # reference's skills/search (shipped in sdarflow.skills). No env here is WebShop's.
    "reference-search": _reference_step(
        "search-qa",
        tasks=128,
        max_turns=4,
        history_turns=4,
        seed_skills="reference",
        rescore={"max_prompt_tokens": 4096},
    ),
}


def build_model(preset: str, folder: Path, command: str) -> Path:
    """The tiny model ``preset`` builds, built into ``folder``; ConfigError for a preset that builds none (it
    needs a base model)."""
    spec = SIZES[preset]["model"]
    if spec is None:
        raise ConfigError(
            f"{command}: preset {preset} builds no model; fix: pass --base-model (e.g. smollm2-135m-instruct)"
        )
    return build_base_model(folder, spec, time_limit_s=SIZES[preset]["sft_time_limit_s"])
