"""``sdarflow study``: the method comparison users run before choosing what to train.

Every (method, seed) cell trains ``rounds`` RL rounds from the same base model, each round generate -> extract-skills
-> rescore -> train with the stage configs the training pipeline builds (``sdarflow.pipeline_config.stage_config``),
then evaluates its final adapter on ``valid``, ``test`` and ``ood`` with a sampling seed of its training seed's; the
base model is evaluated per seed the same way, and comparisons pair tasks. A cell (its ``cell.json``, written last)
is reused by a rerun only when settings and provenance (code, base build, machine) match.
``sdarflow.study_report`` turns the cells into ``study.json``, ``report.md`` and ``report.html``. The study pipeline's
components (``components/study.py``) run the same functions, one step per task (:func:`run_step`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sdarflow import storage
from sdarflow.config import MAX_SEED, Checked, content_hash, opt
from sdarflow.errors import ConfigError
from sdarflow.extensions.options import split_method
from sdarflow.model_cache import local_model
from sdarflow.pipeline_config import PipelineConfig, stage_config
from sdarflow.provenance import provenance, reuse_key
from sdarflow.registry.intake import load_report
from sdarflow.rounds import Carry, run_round
from sdarflow.sizes import SIZES, build_model
from sdarflow.stages import STAGES
from sdarflow.start_point import makes_anything, start_point
from sdarflow.study_report import SPLITS, analyze, write_reports

log = logging.getLogger(__name__)

CELL_FILE = "cell.json"
SETTINGS_FILE = "study_settings.json"  # the study pipeline's checked settings, read by its other tasks
DEFAULT_METHODS = ("grpo", "sdar")
DEFAULT_SEEDS = (0, 1, 2)
BASE_CELL = "base"


@dataclass
class StudySettings(Checked):
    what: ClassVar[str] = "study"

    methods: list[str] = opt(
        [], "methods to compare (grpo, the baseline, among them); a method may add options"
    )
    seeds: list[int] = opt([], "training seeds: each method trains once per seed", ge=0, le=MAX_SEED)
    rounds: int = opt(1, "RL rounds per cell", ge=1)
    out: str = opt("", "the study's folder or URI", io=True)
    base_model: str = opt(
        "", "base model; empty: build the preset's demo base model into OUT/base-model", io=True
    )
    env: str = opt("textworld-cooking", "the environment suite")
    preset: str = opt("demo", "sizes from sdarflow.sizes.SIZES", choices=tuple(SIZES))
    stage_settings: dict[str, dict[str, Any]] = opt(
        {}, "per-stage settings on top of the preset's, e.g. {train: {lr: 0.002}}", keys=tuple(STAGES)
    )

    def validate(self) -> None:
        for name in self.methods:
            split_method(name)
        if "grpo" not in self.methods:
            raise ConfigError(
                "study: methods must include grpo, the baseline every figure is relative to; fix: add grpo to "
                "--methods"
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(
                f"study: seeds {self.seeds} must be distinct and at least one; fix: e.g. --seeds 0 1 2"
            )


def cell_name(method: str, seed: int) -> str:
    return f"{method}-seed{seed}"


def preset_sizes(s: StudySettings) -> dict[str, Any]:
    """The preset's task, group and evaluation sizes (its stage settings are in ``stage_settings``)."""
    return {k: v for k, v in SIZES[s.preset]["pipeline"].items() if k != "stage_settings"}


def stage_settings(s: StudySettings) -> dict[str, dict[str, Any]]:
    """Per-stage settings every cell runs with: the preset's, then the study's own on top."""
    settings = {k: dict(v) for k, v in SIZES[s.preset]["pipeline"].get("stage_settings", {}).items()}
    for stage, values in s.stage_settings.items():
        settings[stage] = {**settings.get(stage, {}), **values}
    return settings


def pipeline_config(s: StudySettings, base: str, method: str, seed: int, storage_root: str):
    """The training pipeline's config for one cell: the preset's sizes, this method (its options as the pipeline's
    ``options``, under the study's stage settings) and seed, our storage."""
    split_method(method)  # a bad row fails here, with the study's words
    method, _, options = method.partition("+")
    return PipelineConfig.from_dict(
        {
            **preset_sizes(s),
            "storage": storage_root,
            "base_model": base,
            "run_id": "study",
            **start_of(s, base),
            "env": s.env,
            "method": method,
            "options": options,
            "seed": seed,
            "stage_settings": stage_settings(s),
        }
    )


def start_of(s: StudySettings, base: str) -> dict[str, str]:
    """Every cell's seed skills and start adapter (``sdarflow.start_point``); what is made for them (a pretrained
    base's library and warm start) is made once, in ``out``/start, and read back after."""
    sizes, folder = SIZES[s.preset], storage.join(s.out, "start")
    if not makes_anything(Path(base), sizes):
        return start_point(Path(base), sizes, s.env, folder, "study")
    uri = storage.join(folder, "start.json")
    if storage.exists(uri) and (start := storage.read_json(uri))["settings_key"] == settings_key(s):
        return {k: start[k] for k in ("seed_skills", "start_adapter")}
    start = start_point(Path(base), sizes, s.env, folder, "study")
    storage.write_json(uri, {**start, "settings_key": settings_key(s)})
    log.info("study: start point (seed skills, warm start) -> %s", uri)
    return start


def cell_uri(s: StudySettings, name: str) -> str:
    return storage.join(s.out, "cells", name)


def settings_key(s: StudySettings) -> str:
    """Hash of what shapes every cell (not the methods and seeds that pick the cells): a rerun into the same
    ``out`` may reuse a finished cell only when this matches, so also the code, the base model's build and content,
    and the machine (``provenance.reuse_key``)."""
    content = {
        "base_model": s.base_model,
        "made_by": reuse_key(provenance(s.base_model)),
        "env": s.env,
        "rounds": s.rounds,
        "sizes": SIZES[s.preset]["pipeline"],
        "warm_start": SIZES[s.preset].get("warm_start"),
        "stage_settings": s.stage_settings,
    }
    return content_hash(content)


def _finished(s: StudySettings, name: str) -> dict | None:
    """The cell's record when it finished earlier (its cell.json exists), else None; ConfigError when it was made
    with other settings, so a changed rerun never mixes its cells with old ones."""
    uri = storage.join(cell_uri(s, name), CELL_FILE)
    if not storage.exists(uri):
        return None
    cell = storage.read_json(uri)
    if cell.get("settings_key") != settings_key(s):
        raise ConfigError(
            f"study: cell {name} in {s.out} was made with other settings, code, base model or machine (key "
            f"{cell.get('settings_key')}, "
            f"now {settings_key(s)}); fix: use a new --output, or the settings in {s.out}/study.json"
        )
    return cell


def _write_cell(s: StudySettings, name: str, cell: dict) -> None:
    """Storage writes whole objects: a cell is finished only when its complete record is there."""
    record = {**cell, "settings_key": settings_key(s), "provenance": provenance(s.base_model)}
    storage.write_json(storage.join(cell_uri(s, name), CELL_FILE), record)


def _evaluate(pc, round_: int, adapter: str, splits: tuple[str, ...] = SPLITS) -> dict:
    """The evaluate stage's output (``uri``, headline ``metrics``) for ``adapter`` ("" the base model)."""
    from sdarflow.stages import evaluate

    # pc has no registry: the report compares with nothing, the study compares the cells itself
    cfg = stage_config(pc, "evaluate", round_, adapter=adapter)
    # each training seed is a replicate, sampled with its own seed (the base model's evaluation for that seed
    # too); valid as well: what a setting search selects on
    return evaluate.run(dataclasses.replace(cfg, seed=cfg.seed + pc.seed, splits=list(splits)))


def _evaluate_report(pc, round_: int, adapter: str) -> tuple[dict, str]:
    """Every split's evaluation: the report (checked as the promotion gate reads it) and its URI."""
    uri = _evaluate(pc, round_, adapter)["uri"]
    return load_report(uri), uri


def base_rollouts(pc, rounds: int) -> dict[str, list[float]]:
    """The base model's rollout success and mean return on each round's train games, sampled as a cell's rollouts
    of that round are (the same stage config and seed): what a cell's train success and return by round are read
    against, since every round plays new games of their own difficulty (the base's success on them moved as much
    as any run's did)."""
    from sdarflow.stages import generate

    metrics = [generate.run(stage_config(pc, "generate", r, adapter=""))["metrics"] for r in range(rounds)]
    return {
        f"{key}_by_round": [m.get(metric) for m in metrics]  # None: an older generate output, reused
        for key, metric in (("train_success", "rollout/success"), ("train_return", "rollout/mean_return"))
    }


def run_base(s: StudySettings, base: str) -> list[dict]:
    """The base model's held-out evaluation for each seed (the same tasks and sampling seeds as that seed's cells),
    and its rollouts on each round's train games (``train_success_by_round``, ``train_return_by_round``)."""
    cells = []
    for seed in s.seeds:
        name = cell_name(BASE_CELL, seed)
        if (cell := _finished(s, name)) is None:
            pc = pipeline_config(s, base, "grpo", seed, storage.join(cell_uri(s, name), "store"))
            t0 = time.perf_counter()
            report, uri = _evaluate_report(pc, 0, "")
            cell = {"method": BASE_CELL, "seed": seed, "eval": report["splits"], "eval_uri": uri,
                    "eval_seconds": time.perf_counter() - t0, **base_rollouts(pc, s.rounds)}  # fmt: skip
            _write_cell(s, name, cell)
            pass1 = report["splits"]["test"]["pass_at_k"]["1"]
            log.info("study: base model, seed %d: test pass@1 %.3f", seed, pass1)
        cells.append(cell)
    return cells


def round_record(r: int, rnd) -> dict:
    """What the study report shows of round ``r`` (a ``rounds.Round``): rollout success, GRPO's signal, the
    teacher, its discrimination, the gate, the auxiliary term's gradient share, and the skill library against the
    env's ground truth (None where it has none)."""
    m_gen, m_sk, m_rs, m_tr = (x["metrics"] for x in (rnd.generate, rnd.extract, rnd.rescore, rnd.train))
    return {
        "round": r,
        "train_success": m_gen["rollout/success"],
        # None from a generate output an interrupted study's older code left in the cell's store
        "train_return": m_gen.get("rollout/mean_return"),
        "zero_adv_group_share": m_tr.get("adv/zero_group_share"),
        "adv_std": m_tr.get("adv/std"),
        "adv_token_weighted_mean": m_tr.get("adv/token_weighted_mean"),
        "format_error_rate": m_gen.get("rollout/format_error_rate"),
        # which engine generated the round (None: an older output) and how fast
        "rollout_engine": rnd.generate.get("engine"),
        "rollout_tokens_per_s": m_gen.get("rollout/tokens_per_s"),
        "teacher_gap_mean": m_rs["rescore/gap_mean"],
        "teacher_gap_positive_share": m_rs["rescore/gap_positive_share"],
        "retrieval_hit_rate": m_rs["rescore/retrieval_hit_rate"],
        # the gate's difference between expert-matching and other turns, and between successful and failed episodes
        **{
            f"gate_discrimination_{c}": m_rs.get(f"rescore/discrimination/{c}/gate")
            for c in ("expert", "success")
        },
        "gate_mean": m_tr.get("sdar/gate_mean"),
        "aux_grad_share": m_tr.get("grad/aux_share"),
        "gate_active_ratio": m_tr.get("sdar/gate_active_ratio"),
        "entropy": m_tr.get("actor/entropy"),
        "kl_loss": m_tr.get("actor/kl_loss"),
        "approx_kl": m_tr.get("actor/approx_kl"),
        "kl_stop_step": m_tr.get("train/kl_stop_step"),
        "clipfrac": m_tr.get("actor/clipfrac"),
        **{f"skill_rules_{v}": m_sk.get(f"skills/rules_{v}") for v in ("right", "wrong", "recipe_blind")},
    }


def run_cell(s: StudySettings, base: str, method: str, seed: int) -> dict:
    """Train one (method, seed) cell for ``s.rounds`` rounds and evaluate it; a finished cell is read back. Each
    round's adapter but the last is also evaluated on ``valid`` (``valid_after_round``: the held-out learning
    curve; the last one's is in the final evaluation), which costs a tenth or less of a round."""
    name = cell_name(method, seed)
    folder = cell_uri(s, name)
    if (cell := _finished(s, name)) is not None:
        log.info("study: %s finished earlier; skipped", name)
        return cell
    pc = pipeline_config(s, base, method, seed, storage.join(folder, "store"))
    carry, seconds, rounds, valid, eval_seconds = Carry(), {}, [], [], 0.0
    for r in range(s.rounds):
        rnd = run_round(pc, r, carry)
        carry = rnd.carry()
        for stage, t in rnd.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + t
        rounds.append(round_record(r, rnd))
        held_out = ""
        if r < s.rounds - 1:
            t0 = time.perf_counter()
            valid.append(_evaluate(pc, r, carry.adapter, splits=("valid",))["metrics"]["valid/pass@1"])
            eval_seconds += time.perf_counter() - t0
            held_out = f" | valid pass@1 {valid[-1]:.3f}"
        log.info(
            "study: %s round %d/%d | train success %.3f%s | gap %.3f | gate %.3f | %.0f s so far",
            name,
            r + 1,
            s.rounds,
            rounds[-1]["train_success"],
            held_out,
            rounds[-1]["teacher_gap_mean"],
            rounds[-1]["gate_mean"] or 0.0,
            sum(seconds.values()),
        )
    t0 = time.perf_counter()
    report, uri = _evaluate_report(pc, s.rounds - 1, carry.adapter)
    cell = {
        "method": method,
        "seed": seed,
        "rounds": rounds,
        "valid_after_round": valid,
        "seconds": seconds,
        "eval_seconds": eval_seconds + time.perf_counter() - t0,  # the final evaluation and the rounds' valid
        "eval": report["splits"],
        "eval_uri": uri,
        "adapter": carry.adapter,
    }
    _write_cell(s, name, cell)
    return cell


def run_study(s: StudySettings) -> dict:
    """Every cell (finished ones read back), then ``study.json`` and the reports in ``s.out``; returns study.json."""
    if not s.base_model:
        if storage.resolve(s.out).uri.startswith("s3://"):
            raise ConfigError(
                f"study: out {s.out} is on object storage, where no base model can be built; fix: pass "
                f"--base-model (an HF folder or s3:// URI)"
            )
        s.base_model = str(build_model(s.preset, Path(s.out) / "base-model", "study"))
    t0 = time.perf_counter()
    base = local_model(s.base_model)  # an s3:// base is copied once per machine
    start_of(s, base)
    run_base(s, base)
    for m in s.methods:
        for seed in s.seeds:
            run_cell(s, base, m, seed)
    return report(s, seconds_this_run=time.perf_counter() - t0)


def report(s: StudySettings, seconds_this_run: float | None = None) -> dict:
    """Read every cell, write ``study.json``, ``report.md``, ``report.html`` and ``curves.png`` to ``s.out``."""
    names = [cell_name(m, seed) for m in (BASE_CELL, *s.methods) for seed in s.seeds]
    cells = {n: _finished(s, n) for n in names}
    missing = [n for n, c in cells.items() if c is None]
    if missing:
        raise ConfigError(
            f"study: cell(s) {missing} have no {CELL_FILE} in {storage.join(s.out, 'cells')}; fix: run them "
            f"first (sdarflow study with the same --output resumes)"
        )
    settings = {
        "methods": s.methods,
        "seeds": s.seeds,
        "rounds": s.rounds,
        "env": s.env,
        "preset": s.preset,
        "base_model": s.base_model,
        "sizes": preset_sizes(s),
        "warm_start": SIZES[s.preset].get("warm_start"),  # every cell's and the base row's start adapter
        "stage_settings": stage_settings(s),  # the preset's with the study's on top
        "seconds_this_run": seconds_this_run,
        "provenance": provenance(s.base_model),
    }
    base_cells = [cells.pop(cell_name(BASE_CELL, seed)) for seed in s.seeds]
    study = analyze(settings, base_cells, list(cells.values()))
    write_reports(s.out, study)
    log.info("study: %d cells -> %s", len(cells), storage.join(s.out, "study.json"))
    return study


def run_step(
    step: str,
    settings: dict | str,
    method: str = "",
    seed: int = 0,
    *,
    html=None,
    markdown=None,
    metrics=None,
) -> str:
    """One study pipeline task, with the settings as a dict or the URI ``check`` stored them at: ``check``
    (validate, store ``study_settings.json``, return its URI), ``start`` (``start_of``; returns that URI again),
    ``base`` and ``cell`` (return the cell's folder) or ``report`` (the study.json URI; fills the UI artifacts)."""
    from sdarflow.kfp_runtime import setup_component

    setup_component()
    if isinstance(settings, str):
        settings = storage.read_json(settings)
    s = StudySettings.from_dict(settings)  # KFP hands JSON numbers in lists over as floats: converted
    if step == "check":
        uri = storage.join(s.out, SETTINGS_FILE)
        storage.write_json(uri, dataclasses.asdict(s))
        return uri
    if step == "report":
        study = report(s)
        for artifact, name in ((html, "report.html"), (markdown, "report.md")):
            if artifact is not None:
                Path(artifact.path).write_bytes(storage.read_bytes(storage.join(s.out, name)))
        if metrics is not None:
            for row in study["table"]:
                for key in ("relative_pass@1", "relative_pass@k", "relative_ood_pass@1"):
                    value = row.get(key)
                    if isinstance(value, int | float) and math.isfinite(value):
                        metrics.log_metric(f"{row['method']}_{key}".replace("@", "_at_"), float(row[key]))
        return storage.join(s.out, "study.json")
    if not s.base_model:
        raise ConfigError("study pipeline: base_model is required; fix: pass an HF folder or s3:// URI")
    base = local_model(s.base_model)
    if step == "start":
        start_of(s, base)
        return storage.join(s.out, SETTINGS_FILE)  # what check stored: base and cells wait for this step
    if step == "base":
        run_base(s, base)
        return storage.join(s.out, "cells")
    if step == "cell":
        run_cell(s, base, method, seed)
        return cell_uri(s, cell_name(method, seed))
    raise ConfigError(f"study pipeline: unknown step {step!r}; allowed: check, start, base, cell, report")
