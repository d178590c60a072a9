"""The SDAR training pipeline: ``prepare`` and the base model's evaluation, then, per round, generate ->
extract-skills -> rescore -> train -> evaluate -> register; each round generates with the adapter the previous
round trained. After the last round,
``promote`` moves its version to production through the gate when the run asks for it (``promote_to``).

Rounds and shards are unrolled at compile time (KFP has no dynamic loops). With ``shards > 1`` each round runs
the ``generate-shards`` sub-pipeline, which fans ``generate`` out over a ``dsl.ParallelFor`` and returns the
shards' URIs (``dsl.Collected``); the next stages read their union. The KFP local runner runs all of it.
Kubernetes settings come from ``pipelines.kube.KubeOptions`` and are applied here, never in components.
"""

import dataclasses

from kfp import dsl

from components.evaluate import evaluate
from components.evaluate_base import evaluate_base
from components.extract_skills import extract_skills
from components.generate import generate
from components.prepare import prepare
from components.promote_candidate import promote_candidate
from components.register import register
from components.rescore import rescore
from components.run_report import run_report
from components.train import train
from pipelines.kube import KubeOptions, wire
from pipelines.params import describe, with_defaults
from sdarflow.errors import ConfigError
from sdarflow.pipeline_config import PipelineConfig

D = PipelineConfig()  # the parameters' defaults: the config's own

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

    def sdar_training(
        storage: str,
        base_model: str,
        run_id: str = D.run_id,
        registry: str = D.registry,
        seed_skills: str = D.seed_skills,
        start_adapter: str = D.start_adapter,
        policy_name: str = D.policy_name,
        env: str = D.env,
        tasks: int = D.tasks,
        group_size: int = D.group_size,
        max_turns: int = D.max_turns,
        method: str = D.method,
        lam: float = D.lam,
        beta: float = D.beta,
        lr: float = D.lr,
        lora_rank: int = D.lora_rank,
        train_steps: int = D.train_steps,
        kl_coef: float = D.kl_coef,
        entropy_coef: float = D.entropy_coef,
        options: str = D.options,
        format_guard: str = D.format_guard,
        rollout_engine: str = D.rollout_engine,
        train_engine: str = D.train_engine,
        retrieval: str = D.retrieval,
        eval_tasks: int = D.eval_tasks,
        eval_samples: int = D.eval_samples,
        promote_to: str = D.promote_to,
        gate_min_gain: float = D.gate_min_gain,
        gate_passk_tolerance: float = D.gate_passk_tolerance,
        gate_ood_tolerance: float = D.gate_ood_tolerance,
        gate_floor: float = D.gate_floor,
        seed: int = D.seed,
        tracking_uri: str = D.tracking_uri,
        stage_settings: dict = {},  # noqa: B006 - KFP needs a literal default
    ) -> str:
        cfg = prepare(
            storage=storage,
            base_model=base_model,
            run_id=run_id,
            registry=registry,
            seed_skills=seed_skills,
            start_adapter=start_adapter,
            policy_name=policy_name,
            env=env,
            tasks=tasks,
            group_size=group_size,
            max_turns=max_turns,
            method=method,
            lam=lam,
            beta=beta,
            lr=lr,
            lora_rank=lora_rank,
            train_steps=train_steps,
            kl_coef=kl_coef,
            entropy_coef=entropy_coef,
            options=options,
            format_guard=format_guard,
            rollout_engine=rollout_engine,
            train_engine=train_engine,
            retrieval=retrieval,
            eval_tasks=eval_tasks,
            eval_samples=eval_samples,
            promote_to=promote_to,
            gate_min_gain=gate_min_gain,
            gate_passk_tolerance=gate_passk_tolerance,
            gate_ood_tolerance=gate_ood_tolerance,
            gate_floor=gate_floor,
            seed=seed,
            tracking_uri=tracking_uri,
            shards=shards,
            stage_settings=stage_settings,
        )
        wire(cfg, "prepare", kube, "prepare")
        config_uri = cfg.output
        # the base model on the rounds' evaluation tasks, beside round 0: each round's report plots it, and the
        # gate compares a first version with it
        base = evaluate_base(config_uri=config_uri)
        wire(base, "evaluate", kube, "evaluate (base model)")
        base_evaluation = base.outputs["evaluation"]
        # Data flows as typed artifacts (Dataset, Model), so the UI shows each round's lineage. Round 0 has no
        # previous adapter (prepare's start_adapter, or a new LoRA, comes through the stage config), no previous
        # library (the seed skills, a URI parameter) and no previous teacher gaps.
        tr = sk = rs = None
        version = previous_register = None
        for r in range(rounds):
            trajectories = _generate_round(config_uri, r, tr, shards, kube, fan_out)
            adapter = {} if tr is None else {"adapter": tr.outputs["trained"]}
            previous = {"previous_uri": seed_skills} if sk is None else {
                "previous_uri": "", "previous": sk.outputs["library"], "rescored": rs.outputs["rescored"]
            }  # fmt: skip
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
            config_uri=config_uri, registered=version, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
        )
        wire(pr, "promote", kube, "promote (gated)")
        rep = run_report(config_uri=config_uri, registered=version, rounds=rounds, shards=shards)
        wire(rep, "promote", kube, "run report")
        return version

    description = f"SDAR: GRPO + gated self-distillation, {rounds} round(s), {shards} generate shard(s)"
    describe(sdar_training, description, parameter_help())
    if preset is not None:
        with_defaults(sdar_training, {"stage_settings": {}, **PIPELINE_PRESETS[preset]})
    return dsl.pipeline(name=PIPELINE_NAME, description=description, pipeline_root=root)(sdar_training)


def parameter_help() -> dict[str, str]:
    """Each pipeline parameter's description: PipelineConfig's field help (the one definition of the settings)."""
    return {f.name: f.metadata["help"] for f in dataclasses.fields(PipelineConfig) if f.name != "shards"}
