"""``sdarflow study``: the method comparison users run before choosing what to train.

Every (method, seed) cell trains ``rounds`` RL rounds from the same base model, each round generate -> extract-skills
-> rescore -> train with the stage configs the training pipeline builds (``sdarflow.pipeline_config.stage_config``),
then evaluates its final adapter on the held-out ``test`` and ``ood`` splits; the base model is evaluated once
with the same tasks and sampling seeds, so every comparison is paired. A cell is finished when its ``cell.json``
exists (written last, atomically): a rerun skips finished cells and redoes unfinished ones from their start.
``sdarflow.study_report`` turns the cells into ``study.json``, ``report.md`` and ``report.html``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdarflow import storage
from sdarflow.algo import METHODS
from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)

CELL_FILE = "cell.json"
BASE_CELL = "base"


@dataclass
class StudySettings:
    methods: list[str]
    seeds: list[int]
    rounds: int
    out: str
    base_model: str = ""  # empty: build the preset's demo base model into OUT/base-model
    env: str = "textworld-cooking"
    preset: str = "demo"  # sizes from sdarflow.demo.PRESETS
    stage_settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # on top of the preset's

    def validate(self) -> None:
        unknown = sorted(set(self.methods) - set(METHODS))
        if unknown:
            raise ConfigError(f"study: unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
        if "grpo" not in self.methods:
            raise ConfigError("study: methods must include grpo, the baseline every figure is relative to")
        if self.rounds < 1:
            raise ConfigError(f"study: rounds ({self.rounds}) must be >= 1")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(
                f"study: seeds {self.seeds} must be distinct and at least one; fix: e.g. --seeds 0 1 2"
            )
        from sdarflow.stages import STAGES

        if not isinstance(self.stage_settings, dict) or not all(
            isinstance(v, dict) for v in self.stage_settings.values()
        ):
            raise ConfigError(
                'study: stage settings must map stage names to settings, e.g. {"train": {"lr": 0.002}}'
            )
        unknown = sorted(set(self.stage_settings) - set(STAGES))
        if unknown:
            raise ConfigError(
                f"study: stage settings name unknown stage(s) {unknown}; valid: {', '.join(STAGES)}"
            )


def cell_name(method: str, seed: int) -> str:
    return f"{method}-seed{seed}"


def pipeline_config(s: StudySettings, base: str, method: str, seed: int, storage_root: str):
    """The training pipeline's config for one cell: the preset's sizes, this method and seed, our storage."""
    from sdarflow.demo import PRESETS
    from sdarflow.pipeline_config import PipelineConfig

    sizes = dict(PRESETS[s.preset]["pipeline"])
    settings = {**sizes.pop("stage_settings", {})}
    for stage, values in s.stage_settings.items():
        settings[stage] = {**settings.get(stage, {}), **values}
    return PipelineConfig.from_dict(
        {
            **sizes,
            "storage": storage_root,
            "base_model": base,
            "run_id": "study",
            "seed_skills": str(Path(base) / "seed_skills"),
            "env": s.env,
            "method": method,
            "seed": seed,
            "stage_settings": settings,
        }
    )


def _timed(seconds: dict[str, float], stage: str, fn, cfg) -> dict:
    t0 = time.perf_counter()
    result = fn(cfg)
    seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - t0
    return result


def _write_cell(folder: Path, cell: dict) -> None:
    tmp = folder / (CELL_FILE + ".tmp")
    tmp.write_text(json.dumps(cell, indent=2, sort_keys=True))
    os.replace(tmp, folder / CELL_FILE)  # atomic: a cell is finished only when its whole record is there


def _evaluate(pc, round_: int, adapter: str) -> tuple[dict, str]:
    from sdarflow.pipeline_config import stage_config
    from sdarflow.stages import evaluate

    # pc has no registry: the report compares with nothing, the study compares the cells itself
    out = evaluate.run(stage_config(pc, "evaluate", round_, adapter=adapter))
    return storage.read_json(storage.join(out["uri"], evaluate.REPORT)), out["uri"]


def run_base(s: StudySettings, base: str) -> dict:
    """The base model's held-out evaluation (the same tasks and sampling seeds as every cell's)."""
    folder = Path(s.out) / "cells" / BASE_CELL
    if (folder / CELL_FILE).is_file():
        return json.loads((folder / CELL_FILE).read_text())
    folder.mkdir(parents=True, exist_ok=True)
    pc = pipeline_config(s, base, "grpo", s.seeds[0], str(folder / "store"))
    t0 = time.perf_counter()
    report, uri = _evaluate(pc, 0, "")
    cell = {
        "method": BASE_CELL,
        "eval": report["splits"],
        "eval_uri": uri,
        "eval_seconds": time.perf_counter() - t0,
    }
    _write_cell(folder, cell)
    log.info("study: base model evaluated: test pass@1 %.3f", report["splits"]["test"]["pass_at_k"]["1"])
    return cell


def run_cell(s: StudySettings, base: str, method: str, seed: int) -> dict:
    """Train one (method, seed) cell for ``s.rounds`` rounds and evaluate it; a finished cell is read back."""
    from sdarflow.pipeline_config import stage_config
    from sdarflow.stages import extract_skills, generate, rescore, train

    folder = Path(s.out) / "cells" / cell_name(method, seed)
    if (folder / CELL_FILE).is_file():
        log.info("study: %s finished earlier; skipped", folder.name)
        return json.loads((folder / CELL_FILE).read_text())
    folder.mkdir(parents=True, exist_ok=True)
    pc = pipeline_config(s, base, method, seed, str(folder / "store"))
    adapter, skills, previous_rescored = "", pc.seed_skills, ""
    seconds: dict[str, float] = {}
    rounds = []
    for r in range(s.rounds):
        gen = _timed(seconds, "generate", generate.run, stage_config(pc, "generate", r, adapter=adapter))
        sk = _timed(
            seconds,
            "extract-skills",
            extract_skills.run,
            stage_config(
                pc, "extract-skills", r, input=[gen["uri"]], previous=skills, rescored=[previous_rescored]
            ),
        )
        rs = _timed(
            seconds,
            "rescore",
            rescore.run,
            stage_config(pc, "rescore", r, input=[gen["uri"]], skills=sk["uri"], adapter=adapter),
        )
        tr = _timed(
            seconds, "train", train.run, stage_config(pc, "train", r, input=[rs["uri"]], adapter=adapter)
        )
        adapter, skills, previous_rescored = tr["uri"], sk["uri"], rs["uri"]
        m_gen, m_rs, m_tr = gen["metrics"], rs["metrics"], tr["metrics"]
        rounds.append(
            {
                "round": r,
                "train_success": m_gen["rollout/success"],
                "zero_adv_group_share": m_tr.get("adv/zero_group_share"),
                "adv_std": m_tr.get("adv/std"),
                "format_error_rate": m_gen.get("rollout/format_error_rate"),
                "teacher_gap_mean": m_rs["rescore/gap_mean"],
                "teacher_gap_positive_share": m_rs["rescore/gap_positive_share"],
                "retrieval_hit_rate": m_rs["rescore/retrieval_hit_rate"],
                "gate_mean": m_tr.get("sdar/gate_mean"),
                "gate_active_ratio": m_tr.get("sdar/gate_active_ratio"),
                "entropy": m_tr.get("actor/entropy"),
                "kl_loss": m_tr.get("actor/kl_loss"),
                "clipfrac": m_tr.get("actor/clipfrac"),
            }
        )
        log.info(
            "study: %s round %d/%d | train success %.3f | gap %.3f | gate %.3f | %.0f s so far",
            folder.name,
            r + 1,
            s.rounds,
            rounds[-1]["train_success"],
            rounds[-1]["teacher_gap_mean"],
            rounds[-1]["gate_mean"] or 0.0,
            sum(seconds.values()),
        )
    t0 = time.perf_counter()
    report, uri = _evaluate(pc, s.rounds - 1, adapter)
    cell = {
        "method": method,
        "seed": seed,
        "rounds": rounds,
        "seconds": seconds,
        "eval_seconds": time.perf_counter() - t0,
        "eval": report["splits"],
        "eval_uri": uri,
        "adapter": adapter,
    }
    _write_cell(folder, cell)
    return cell


def run_study(s: StudySettings) -> dict:
    """Every cell (finished ones read back), then ``study.json`` and the reports in ``s.out``; returns study.json."""
    from sdarflow.demo import PRESETS
    from sdarflow.study_report import analyze, write_reports
    from sdarflow.train.warmstart import build_base_model

    s.validate()
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    preset = PRESETS[s.preset]
    base = s.base_model or str(
        build_base_model(out / "base-model", preset["model"], time_limit_s=preset["sft_time_limit_s"])
    )
    t0 = time.perf_counter()
    base_cell = run_base(s, base)
    cells = [run_cell(s, base, m, seed) for m in s.methods for seed in s.seeds]
    settings = {
        "methods": s.methods,
        "seeds": s.seeds,
        "rounds": s.rounds,
        "env": s.env,
        "preset": s.preset,
        "base_model": base,
        "sizes": {k: v for k, v in preset["pipeline"].items() if k != "stage_settings"},
        "stage_settings": s.stage_settings,
        "seconds_this_run": time.perf_counter() - t0,
    }
    study = analyze(settings, base_cell, cells)
    write_reports(out, study)
    log.info("study: %d cells -> %s", len(cells), out / "study.json")
    return study
