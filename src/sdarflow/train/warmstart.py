"""Build the demo base policy: expert walkthroughs -> seed skill library -> tokenizer -> tiny Qwen2 -> SFT.

A ``skill_share`` of the SFT prompts carry their task type's skills, built exactly as rescore builds the teacher's
prompts, so the model learns to read skills where the teacher will show them (else SDAR's privileged context would
be noise to it). A ``solution_share`` of them (drawn apart, so a spec without it builds what it built before) carry
their game's solution instead, as ``rescore --teacher-context solution`` shows it: a base whose solution teacher is
better than its student, for the positive control. The output is an HF model folder plus ``sdarflow_build.json``; one whose settings hash matches is
reused.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from sdarflow import progress, storage
from sdarflow.config import MAX_SEED, Checked, content_hash, opt
from sdarflow.envs import get_suite
from sdarflow.models.device import resolve_device
from sdarflow.models.tiny import TinyShape, build_model, save, train_tokenizer
from sdarflow.rollout.prompt import (
    PRIVILEGED_TEMPLATE,
    build_messages,
    encode_prompt,
    prompt_text,
    teacher_prompt_ids,
)
from sdarflow.skills.extract import EpisodeActions, extract_skills
from sdarflow.skills.library import SkillLibrary
from sdarflow.skills.retrieve import keyword
from sdarflow.teacher.solution import task_solutions
from sdarflow.train.sft import STOP_WINDOW, SFTPair, sft

log = logging.getLogger(__name__)

BUILD_FILE = "sdarflow_build.json"
SEED_SKILLS = "seed_skills"  # the seed skill library inside the base model folder, published
# Part of the settings hash: bump when what an unchanged spec builds changes (the SFT data's prompt, observation or
# skill format, or the training schedule), so a model built before is rebuilt. 3: transformers' cosine schedule;
# 4: the seed library is extracted with direction contrasts and marked source "seed".
RECIPE_VERSION = 4


@dataclass(frozen=True)
class BaseModelSpec(Checked):
    """What the demo base model is built from (what moved held-out test pass@1, measured: docs/training.md, "Base
    model recipe")."""

    what: ClassVar[str] = "build-model"

    env: str = opt("textworld-cooking", "environment whose walkthroughs train it")
    tasks: int = opt(144, "train games whose walkthroughs make the SFT data", ge=1)
    sft_steps: int = opt(500, "most SFT steps", ge=1)
    sft_batch_size: int = opt(16, "SFT pairs per step", ge=1)
    sft_lr: float = opt(3e-3, "SFT learning rate", gt=0)
    skill_share: float = opt(0.5, "share of SFT prompts that carry their task type's skills", ge=0, le=1)
    skill_place: str = opt("prefix", "where skilled SFT prompts carry the skills: rescore's --skill-place")
    solution_share: float = opt(
        0.0,
        "share of SFT prompts that carry their game's solution instead (train games only), where rescore "
        "--teacher-context solution puts it, so the model learns to read one; 0 = none",
        ge=0,
        le=1,
    )
    history_turns: int = opt(4, "past turns each SFT prompt shows", ge=0)
    vocab_size: int = opt(2048, "the trained tokenizer's vocabulary", ge=64)
    seed: int = opt(0, "seed of the games, weights and SFT", ge=0, le=MAX_SEED)
    sft_stop_at_loss: float = opt(
        0.0,
        f"stop the SFT once its mean loss over {STOP_WINDOW} steps is at or below this (sft_steps is then the most "
        f"it takes); 0 = every step",
        ge=0,
    )

    def hash(self) -> str:
        spec = asdict(self)
        # off, the recipe before the field existed: models built then stay valid
        for field in ("sft_stop_at_loss", "solution_share"):
            if not spec[field]:
                del spec[field]
        content = {**spec, "shape": asdict(TinyShape()), "recipe_version": RECIPE_VERSION}
        return content_hash(content)


@dataclass
class ExpertStep:
    task_id: str
    task_type: str
    instruction: str
    actions: list[str]
    observation: str
    action: str


def expert_steps(env_name: str, n_tasks: int) -> tuple[list[ExpertStep], list[EpisodeActions]]:
    """Play each train task's expert walkthrough; return the decision points and the episodes."""
    suite = get_suite(env_name)
    steps: list[ExpertStep] = []
    episodes: list[EpisodeActions] = []
    for task in progress.bar(suite.tasks("train", n_tasks), desc="walkthroughs", unit="game"):
        env = suite.make(task)
        reset = env.reset()
        obs, actions, won = reset.observation, [], False
        while (action := env.expert_action()) is not None:
            steps.append(
                ExpertStep(task.task_id, task.task_type, reset.instruction, list(actions), obs, action)
            )
            result = env.step(action)
            actions.append(action)
            obs, won = result.observation, result.won
            if result.done:
                break
        env.close()
        episodes.append(EpisodeActions(task.task_id, task.task_type, tuple(actions), won, reset.instruction))
    return steps, episodes


def seed_library(episodes: list[EpisodeActions]) -> SkillLibrary:
    """The seed skill library of expert walkthroughs: demonstrations, not lucky successes, so any number supports
    a skill."""
    return extract_skills(episodes, min_support=1, origin={"source": "seed"})


def is_built(out_dir: Path, spec: BaseModelSpec) -> bool:
    info = out_dir / BUILD_FILE
    return (
        info.is_file()
        and json.loads(info.read_text()).get("spec_hash") == spec.hash()
        # builds from before stage inputs had to be published are rebuilt (the weights come out the same)
        and storage.is_published(str(out_dir / SEED_SKILLS))
    )


def _sft_prompt(
    tokenizer, lib: SkillLibrary, task_type: str, messages: list[dict], privileged: str | bool, place: str
) -> list[int]:
    """The student prompt, or the teacher prompt rescore would build with ``place``: with the task type's skills
    (``privileged`` True) or with the text ``privileged`` (a solution)."""
    ids = encode_prompt(tokenizer, messages)
    if not privileged:
        return ids
    text = prompt_text(tokenizer, ids)
    extra = keyword(lib, task_type, text).text if privileged is True else privileged
    return teacher_prompt_ids(tokenizer, ids, messages, extra, place, student_text=text)


def _sft_data(spec: BaseModelSpec) -> tuple:
    """(tokenizer trained on the walkthroughs, SFT pairs, seed skill library) for ``spec``: each decision point of
    the expert walkthroughs is a pair; a ``skill_share`` of them get the teacher's prompt with skills."""
    steps, episodes = expert_steps(spec.env, spec.tasks)
    solved = sum(e.success for e in episodes)
    log.info("walkthroughs: %d games, %d solved, %d decision points", len(episodes), solved, len(steps))
    seed_lib = seed_library(episodes)

    rng, solution_rng = random.Random(spec.seed), random.Random(f"{spec.seed}/solution")
    contexts = [build_messages(s.instruction, s.actions, s.observation, spec.history_turns) for s in steps]
    with_skills = [rng.random() < spec.skill_share for _ in steps]
    privileged: list[str | bool] = list(with_skills)
    if spec.solution_share:  # rescore's lookup and its checks (an env without solutions is a one-line error)
        rows = [{"env": spec.env, "split": "train", "task_id": s.task_id} for s in steps]
        privileged = [text if solution_rng.random() < spec.solution_share else skilled
                      for text, skilled in zip(task_solutions(rows), with_skills, strict=True)]  # fmt: skip
    corpus = [m["content"] for msgs in contexts for m in msgs] + [s.action for s in steps]
    corpus += [sk.text for sk in seed_lib.skills.values()]
    # The privileged header once per skilled or solution prompt, so the tokenizer learns it as the teacher shows it.
    corpus += [PRIVILEGED_TEMPLATE.format(skills="", prompt="")] * sum(bool(p) for p in privileged)
    corpus += [p for p in privileged if isinstance(p, str)]
    tokenizer = train_tokenizer(corpus, spec.vocab_size)
    eos = tokenizer.eos_token_id
    pairs = [
        SFTPair(
            _sft_prompt(tokenizer, seed_lib, s.task_type, msgs, extra, spec.skill_place),
            tokenizer(s.action, add_special_tokens=False)["input_ids"] + [eos],
        )
        for s, msgs, extra in zip(steps, contexts, privileged, strict=True)
    ]
    log.info(
        "SFT: %d pairs, mean prompt %.0f tokens", len(pairs), sum(len(p.prompt) for p in pairs) / len(pairs)
    )
    return tokenizer, pairs, seed_lib


def build_base_model(
    out_dir: str | Path,
    spec: BaseModelSpec = BaseModelSpec(),
    force: bool = False,
    time_limit_s: float | None = None,
    device: str = "auto",
) -> Path:
    """Build the base model ``spec`` describes into ``out_dir`` (or keep an up-to-date one there). Deterministic:
    the same spec gives the same model on any machine of the same device type; past ``time_limit_s`` (not part of
    the spec: it cannot change the result) the build fails instead of stopping early."""
    import torch

    out_dir = Path(out_dir)
    if not force and is_built(out_dir, spec):
        log.info("base model %s is up to date (spec %s)", out_dir, spec.hash())
        return out_dir
    # staged beside out_dir and swapped in only when complete, so an interrupted build never looks complete
    with storage.replacing_folder(out_dir, BUILD_FILE, "build-model") as tmp:
        t0 = time.perf_counter()
        tokenizer, pairs, seed_lib = _sft_data(spec)
        place = resolve_device(device)
        model = build_model(tokenizer, TinyShape(vocab_size=spec.vocab_size), spec.seed).to(place)
        history = sft(
            model,
            pairs,
            tokenizer.pad_token_id,
            steps=spec.sft_steps,
            batch_size=spec.sft_batch_size,
            lr=spec.sft_lr,
            seed=spec.seed,
            time_limit_s=time_limit_s,
            stop_at_loss=spec.sft_stop_at_loss,
        )
        save(model.cpu(), tokenizer, tmp)
        seed_lib.publish(str(tmp / SEED_SKILLS))
        info = {
            "spec": asdict(spec),
            "spec_hash": spec.hash(),
            "sft_pairs": len(pairs),
            "sft_final_loss": sum(h["loss"] for h in history[-20:]) / max(1, len(history[-20:])),
            "sft_steps_taken": len(history),
            "seed_skill_library": seed_lib.version,
            "seconds": round(time.perf_counter() - t0, 1),
            "device": str(place),
            # what else decides the weights' bits on a CPU (README: the demo's figures are per CPU kind)
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(),
        }
        (tmp / BUILD_FILE).write_text(json.dumps(info, indent=2))
    log.info(
        "base model built in %.0f s: %s (SFT loss %.3f)", info["seconds"], out_dir, info["sft_final_loss"]
    )
    return out_dir
