"""Stage ``evaluate``: n sampled episodes per task on ``test`` and ``ood``; pass@k (unbiased estimator), per task
type, format-error rate, mean turns, 95% CIs. Publishes ``report.json`` plus Markdown/HTML reports with plots."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sdarflow import report as render
from sdarflow import storage
from sdarflow.config import MAX_SEED, StageConfig, opt
from sdarflow.defaults import DEFAULT_POLICY_NAME
from sdarflow.envs import SPLITS, get_suite
from sdarflow.errors import ConfigError
from sdarflow.evaluate.metrics import BASE_ADAPTER, PROTOCOL, REPORT, REPORT_KIND
from sdarflow.models.device import device_opt
from sdarflow.rollout.engine import engine_opt, prompt_format_opt
from sdarflow.rollout.envhost import envs_opt
from sdarflow.stages.common import allow_unpublished_opt, once, require
from sdarflow.tracking import check_available, log_stage_run, tracking_opt

log = logging.getLogger(__name__)


@dataclass
class EvaluateConfig(StageConfig):
    stage = "evaluate"
    model: str = opt("", "base model HF folder", reads=True)
    adapter: str = opt(
        "",
        "adapter, or full fine-tune of --model, to evaluate (published URI or folder); empty = the base model",
        reads=True,
    )
    output: str = opt("", "output report URI", io=True)
    baseline: str = opt(
        "", "a previous evaluate output (e.g. production's) to compare against in the plots", reads=True
    )
    env: str = opt("textworld-cooking", "environment suite name")
    splits: list[str] = opt(["test", "ood"], "splits to evaluate")
    tasks: int = opt(4, "tasks per split", ge=1)
    first_task: int = opt(
        0, "index of each split's first task (a scheduled pipeline run moves it on: data_cursor)", ge=0
    )
    samples: int = opt(4, "n samples per task (>= the largest k)", ge=1)
    max_turns: int = opt(0, "turn limit; 0 = the env's default for the split", ge=0)
    registry: str = opt(
        "", "registry whose production adapter is the baseline when --baseline is empty", io=True
    )
    policy_name: str = opt(DEFAULT_POLICY_NAME, "policy name in --registry")
    engine: str = engine_opt()
    device: str = device_opt()
    envs: str = envs_opt()
    max_new_tokens: int = opt(0, "tokens per response; 0 = the env's own need (as generate)", ge=0)
    prompt_format: str = prompt_format_opt()
    # The SDAR reference validates at 0.4, sampled (val_kwargs in examples/grpo_trainer/run_alfworld.sh).
    temperature: float = opt(0.4, "sampling temperature (the reference's validation setting)", ge=0)
    history_turns: int = opt(4, "recent actions kept in the prompt", ge=0)
    batch_size: int = opt(64, "prompts per engine call", ge=1)
    seed: int = opt(
        1234, "base seed (differs from generate's so evaluation samples are fresh)", ge=0, le=MAX_SEED
    )
    allow_unpublished: bool = allow_unpublished_opt()
    overwrite: bool = opt(False, "replace an existing report at --output", io=True)
    tracking_uri: str = tracking_opt()

    def validate(self) -> None:
        bad = [s for s in self.splits if s not in SPLITS]
        if bad or not self.splits:
            raise ConfigError(
                f"evaluate: splits {bad or '[]'} invalid; fix: pass splits among {', '.join(SPLITS)}"
            )


Config = EvaluateConfig  # the stage's exports are Config and run (sdarflow.stages)


def _play(cfg: EvaluateConfig, split: str, suite, engine, params) -> list[dict]:
    """One split's episodes, as the report's per-episode rows."""
    from sdarflow.rollout.loop import run_rollout

    episodes = run_rollout(
        engine,
        suite,
        suite.tasks(split, cfg.tasks, cfg.first_task),
        cfg.samples,
        params,
        engine.tokenizer,
        run_id="eval",
        round_=0,
        policy_version=cfg.adapter or "base",
        desc=f"evaluate {split}",
    ).episodes
    return [
        {
            "task_id": e.task.task_id,
            "task_type": e.task.task_type,
            "split": split,
            "success": e.won,
            "turns": len(e.rows),
            "format_errors": e.format_errors,
            "actions": len(e.rows),
        }
        for e in episodes
    ]


@once(REPORT_KIND)
def run(cfg: EvaluateConfig) -> dict:
    from sdarflow.evaluate.metrics import build_report
    from sdarflow.models.identity import adapter_folder_id, base_fingerprint
    from sdarflow.stages.generate import open_engine

    require("evaluate", model=cfg.model, output=cfg.output)
    check_available(cfg.tracking_uri)
    suite = get_suite(cfg.env)
    baseline = _baseline(cfg)  # a bad baseline report fails here, before any episode
    engine, params, adapter = open_engine(cfg, suite)
    try:
        results = [row for split in cfg.splits for row in _play(cfg, split, suite, engine, params)]
    finally:
        engine.close()
    report = build_report(
        results,
        adapter=cfg.adapter or BASE_ADAPTER,
        base_model=cfg.model,
        # what was evaluated, by content: register refuses a report of another adapter or base model
        adapter_id=adapter_folder_id(adapter) if adapter else None,
        base_id=base_fingerprint(cfg.model),
        config_hash=cfg.config_hash(),
        env=cfg.env,
        # what the gate requires to be equal before it pairs two reports task by task
        protocol={k: params.prompt_format if k == "prompt_format" else getattr(cfg, k) for k in PROTOCOL},
    )
    headline = {f"{s}/pass@{k}": v for s, d in report["splits"].items() for k, v in d["pass_at_k"].items()}
    _publish(cfg, report, baseline, headline)
    shown = [
        f"{split}/pass@{k} {render.with_interval(v, d['ci95'][k])} "
        f"({d['n_tasks']} tasks x {d['samples_per_task']})"
        for split, d in report["splits"].items()
        for k, v in d["pass_at_k"].items()
    ]
    log.info("evaluate: %s -> %s", ", ".join(shown), cfg.output)
    return {"uri": cfg.output, "metrics": headline}


def _publish(cfg: EvaluateConfig, report: dict, baseline: dict | None, headline: dict[str, float]) -> None:
    """The report as JSON, Markdown and HTML with its plots, published at ``cfg.output`` (and, with
    ``--tracking-uri``, logged to MLflow with the ``headline`` metrics)."""
    from sdarflow.evaluate.report import evaluation_report, plots

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        images = plots(report, baseline)
        for key, png in images.items():
            (out / f"{key}.png").write_bytes(png)
        doc = evaluation_report(report, baseline, images)
        (out / REPORT).write_text(json.dumps(report, indent=2, sort_keys=True))
        (out / "report.md").write_text(render.markdown(doc, {k: f"{k}.png" for k in images}))
        (out / "report.html").write_text(render.html(doc))
        storage.publish_dir(
            out,
            cfg.output,
            kind=REPORT_KIND,
            overwrite=cfg.overwrite,
            config_hash=cfg.config_hash(),
            inputs=[cfg.model] + ([cfg.adapter] if cfg.adapter else []),
        )
        tags = {"sdarflow.output": cfg.output, "sdarflow.config_hash": cfg.config_hash()}
        log_stage_run(cfg.tracking_uri, "evaluate", cfg.to_dict(), headline, artifacts=out, tags=tags)


def _baseline(cfg: EvaluateConfig) -> dict | None:
    """The report to compare against: --baseline, else the registry's production version (if there is one)."""
    if cfg.baseline:
        from sdarflow.registry.intake import load_report

        return load_report(cfg.baseline)
    if not cfg.registry:
        return None
    from sdarflow.registry import Registry

    registry = Registry(cfg.registry)
    if "production" not in registry.aliases(cfg.policy_name):
        return None
    return registry.eval_report(cfg.policy_name, "production")
