"""The SDAR training pipeline: ``prepare``, the base model's and production's evaluations, then, per round,
generate -> extract-skills -> rescore -> train -> evaluate -> register; each round generates with the adapter the
previous round trained. After the last round, ``promote`` moves its version to production through the gate when
the run asks for it (``promote_to``). A run that would train nothing new (``prepare``'s ``skip``: the same start
adapter, tasks, seeds and settings as the newest registered version's run) runs ``skip-run`` instead, which
says so.

Rounds and shards are unrolled at compile time (KFP has no dynamic loops). With ``shards > 1`` each round runs
the ``generate-shards`` sub-pipeline, which fans ``generate`` out over a ``dsl.ParallelFor`` and returns the
shards' URIs (``dsl.Collected``); the next stages read their union. The KFP local runner runs all of it.
Kubernetes settings come from ``pipelines.kube.KubeOptions`` and are applied here, never in components.
"""

import dataclasses

from kfp import dsl

from components.evaluate import evaluate
from components.evaluate_base import evaluate_base
from components.evaluate_production import evaluate_production
from components.extract_skills import extract_skills
from components.generate import generate
from components.prepare import prepare
from components.promote_candidate import promote_candidate
from components.register import register
from components.rescore import rescore
from components.run_report import run_report
from components.skip_run import skip_run
from components.train import train
from pipelines.kube import KubeOptions, wire
from pipelines.params import describe, with_defaults, with_parameters
from sdarflow.errors import ConfigError
from sdarflow.pipeline_config import PipelineConfig, kfp_parameters

PIPELINE_NAME = "sdar-training"


def sharded_generate(shards: int, kube: KubeOptions | None):
    """A sub-pipeline: ``generate`` fanned out over ``shards`` in a ``dsl.ParallelFor``; its output is the list
    of the shards' dataset URIs (``dsl.Collected``).

    A sub-pipeline rather than a loop in the main DAG because the KFP local runner (2.17) hands a loop's
    task-output inputs (the config URI, the previous round's adapter) the loop item instead; inside a
    sub-pipeline they arrive as its inputs, which it passes correctly, and the compiled spec is the same fan-out.
    """

    @dsl.pipeline(name="generate-shards", description=f"generate, {shards} shards in parallel")
    def generate_shards(config_uri: str, rl_round: int, adapter_uri: str) -> list[str]:
        with dsl.ParallelFor(list(range(shards)), parallelism=shards) as shard:
            gen = generate(config_uri=config_uri, rl_round=rl_round, adapter_uri=adapter_uri, shard=shard)
            wire(gen, "generate", kube, "generate (shard)")
        return dsl.Collected(gen.outputs["Output"])

    return generate_shards


def _generate_round(config_uri, r: int, trained, shards: int, kube, fan_out) -> dict:
    """One round's rollouts, as the trajectory inputs of the downstream tasks: the single ``Dataset``, or the list
    of the shards' dataset URIs (their union is what the next stages read). ``trained`` is the previous round's
    train task (None in round 0)."""
    if shards == 1:
        adapter = {} if trained is None else {"adapter": trained.outputs["trained"]}
        gen = generate(config_uri=config_uri, rl_round=r, shard=0, **adapter)
        wire(gen, "generate", kube, f"generate (round {r})")
        return {"trajectories": gen.outputs["trajectories"], "trajectory_shards": []}
    # a sub-pipeline's inputs are parameters here: the adapter travels as its URI
    uri = "" if trained is None else trained.outputs["Output"]
    gen = fan_out(config_uri=config_uri, rl_round=r, adapter_uri=uri)
    gen.set_display_name(f"generate (round {r}, {shards} shards)")
    return {"trajectory_shards": gen.output}


def build_training_pipeline(
    rounds: int = 2, shards: int = 1, kube: KubeOptions | None = None, preset: str | None = None
):
    """Return the ``@dsl.pipeline`` function for ``rounds`` chained RL rounds with ``shards`` generate tasks
    per round. ``kube`` None leaves out the Kubernetes settings (the local runner ignores them either way).
    ``preset`` (``sdarflow.sizes.PIPELINE_PRESETS``: demo, production, ...) sets the parameters' defaults; none
    keeps PipelineConfig's."""
    if rounds < 1:
        raise ConfigError(f"rounds ({rounds}) must be >= 1; fix: --rounds 1 or more")
    if shards < 1:
        raise ConfigError(f"shards ({shards}) must be >= 1; fix: --shards 1 or more")
    if preset is not None:
        from sdarflow.sizes import (
            PIPELINE_PRESETS,  # imports torch (the demo model's recipe): only when asked
        )

        if preset not in PIPELINE_PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; allowed: {', '.join(PIPELINE_PRESETS)}")
    root = kube.pipeline_root if kube and kube.pipeline_root else None
    fan_out = sharded_generate(shards, kube) if shards > 1 else None

    def _rounds(config_uri, promote_to):
        """The run: the base model's and production's evaluations, the rounds, promotion and the run report;
        returns the last registered version's URI."""
        # the base model on the rounds' evaluation tasks, beside round 0: each round's report plots it, and the
        # gate compares a first version with it
        base = evaluate_base(config_uri=config_uri)
        wire(base, "evaluate", kube, "evaluate (base model)")
        base_evaluation = base.outputs["evaluation"]
        # production on the same tasks, so the gate pairs it with the candidate: a GPU task only in a run that
        # promotes to production (a no-op before the first production version), else a CPU one that says so
        with dsl.If(promote_to == "production", name="promotes"):
            gated = evaluate_production(config_uri=config_uri)
            wire(gated, "evaluate", kube, "evaluate (production)")
        with dsl.Else(name="does-not-promote"):
            ungated = evaluate_production(config_uri=config_uri)
            wire(ungated, "promote", kube, "evaluate (production): not needed")
        # Data flows as typed artifacts (Dataset, Model), so the UI shows each round's lineage. Round 0 has no
        # previous adapter (prepare's start_adapter, or a new LoRA, comes through the stage config), no previous
        # library (the run's seed skills come the same way) and no previous teacher gaps.
        tr = sk = rs = None
        version = previous_register = None
        for r in range(rounds):
            trajectories = _generate_round(config_uri, r, tr, shards, kube, fan_out)
            adapter = {} if tr is None else {"adapter": tr.outputs["trained"]}
            previous = (
                {} if sk is None else {"previous": sk.outputs["library"], "rescored": rs.outputs["rescored"]}
            )
            sk = extract_skills(config_uri=config_uri, rl_round=r, **trajectories, **previous)
            rs = rescore(
                config_uri=config_uri, rl_round=r, **trajectories, skills=sk.outputs["library"], **adapter
            )
            tr = train(config_uri=config_uri, rl_round=r, rescored=rs.outputs["rescored"], **adapter)
            ev = evaluate(
                config_uri=config_uri, rl_round=r, adapter=tr.outputs["trained"], baseline=base_evaluation
            )
            rg = register(
                config_uri=config_uri,
                rl_round=r,
                adapter=tr.outputs["trained"],
                evaluation=ev.outputs["evaluation"],
                base_evaluation=base_evaluation,
                **trajectories,
                skills=sk.outputs["library"],
                rescored=rs.outputs["rescored"],
                kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            )
            if version is not None:
                # Registry versions follow the rounds (round r is v(r+1) in a fresh registry), so "latest" is
                # the newest round; only the register task waits, training runs on.
                rg.after(previous_register)
            previous_register = rg
            for task, name in (
                (sk, "extract-skills"),
                (rs, "rescore"),
                (tr, "train"),
                (ev, "evaluate"),
                (rg, "register"),
            ):
                wire(task, name, kube, f"{name} (round {r})")
            version = rg.output
        pr = promote_candidate(
            config_uri=config_uri,
            registered=version,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            production_evaluation=dsl.OneOf(gated.outputs["Output"], ungated.outputs["Output"]),
        )
        wire(pr, "promote", kube, "promote (gated)")
        rep = run_report(
            config_uri=config_uri,
            promotion=pr.outputs["Output"],
            base_evaluation=base.outputs["Output"],
            rounds=rounds,
            shards=shards,
        )
        wire(rep, "promote", kube, "run report")
        return version

    def sdar_training(settings: dict) -> str:
        cfg = prepare(**settings, shards=shards)
        wire(cfg, "prepare", kube, "prepare")
        # a run that would train nothing new (the same start adapter, tasks, seeds and settings as the newest
        # registered version's run) stops here, saying so
        with dsl.If(cfg.outputs["skip"] == "", name="new-request"):
            version = _rounds(cfg.outputs["config_uri"], settings["promote_to"])
        with dsl.Else(name="unchanged"):
            skipped = skip_run(reason=cfg.outputs["skip"])
            wire(skipped, "promote", kube, "skip (nothing changed)")
        return dsl.OneOf(version, skipped.outputs["Output"])

    description = f"SDAR: GRPO + gated self-distillation, {rounds} round(s), {shards} generate shard(s)"
    # the parameters are PipelineConfig's fields (shards is fixed at compile time; storage and the model are
    # required)
    params = kfp_parameters(required=("storage", "base_model"), leave_out=("shards",))
    pipeline = with_parameters(sdar_training, params, returns=str)
    # each parameter's description: PipelineConfig's field help (the one definition of the settings)
    describe(pipeline, description, {f.name: f.metadata["help"] for f in dataclasses.fields(PipelineConfig)})
    if preset is not None:
        with_defaults(pipeline, PIPELINE_PRESETS[preset])
    return dsl.pipeline(name=PIPELINE_NAME, description=description, pipeline_root=root)(pipeline)
