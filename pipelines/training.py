"""The SDAR training pipeline: ``prepare`` then, per round, generate -> extract-skills -> rescore -> train ->
evaluate -> register; each round generates with the adapter the previous round trained.

Rounds are unrolled at compile time (KFP has no dynamic loops). Caching is off for the stochastic stages.
"""

from kfp import dsl

from components.evaluate import evaluate
from components.extract_skills import extract_skills
from components.generate import generate
from components.prepare import prepare
from components.register import register
from components.rescore import rescore
from components.train import train

PIPELINE_NAME = "sdar-training"


def build_training_pipeline(rounds: int = 2):
    """Return the ``@dsl.pipeline`` function for ``rounds`` chained RL rounds."""
    if rounds < 1:
        raise ValueError(f"rounds ({rounds}) must be >= 1")

    @dsl.pipeline(name=PIPELINE_NAME, description=f"SDAR: GRPO + gated self-distillation, {rounds} round(s)")
    def sdar_training(
        storage: str,
        base_model: str,
        run_id: str = "",
        registry: str = "",
        seed_skills: str = "",
        policy_name: str = "sdar-policy",
        env: str = "textworld-cooking",
        tasks: int = 8,
        group_size: int = 4,
        max_turns: int = 0,
        method: str = "sdar",
        lam: float = 0.01,
        beta: float = 5.0,
        retrieval: str = "keyword",
        eval_tasks: int = 4,
        eval_samples: int = 4,
        promote_to: str = "",
        seed: int = 0,
        stage_settings: dict = {},  # noqa: B006 - KFP needs a literal default
    ) -> str:
        cfg = prepare(
            storage=storage,
            base_model=base_model,
            run_id=run_id,
            registry=registry,
            seed_skills=seed_skills,
            policy_name=policy_name,
            env=env,
            tasks=tasks,
            group_size=group_size,
            max_turns=max_turns,
            method=method,
            lam=lam,
            beta=beta,
            retrieval=retrieval,
            eval_tasks=eval_tasks,
            eval_samples=eval_samples,
            promote_to=promote_to,
            seed=seed,
            stage_settings=stage_settings,
        ).set_display_name("prepare")
        config_uri = cfg.output
        adapter = ""
        skills = seed_skills
        version = None
        for r in range(rounds):
            gen = generate(config_uri=config_uri, rl_round=r, adapter=adapter)
            sk = extract_skills(
                config_uri=config_uri, rl_round=r, trajectories=gen.outputs["Output"], previous=skills
            )
            rs = rescore(
                config_uri=config_uri,
                rl_round=r,
                trajectories=gen.outputs["Output"],
                skills=sk.output,
                adapter=adapter,
            )
            tr = train(config_uri=config_uri, rl_round=r, rescored=rs.outputs["Output"], adapter=adapter)
            ev = evaluate(config_uri=config_uri, rl_round=r, adapter=tr.outputs["Output"])
            rg = register(
                config_uri=config_uri,
                rl_round=r,
                adapter=tr.outputs["Output"],
                eval_report=ev.outputs["Output"],
                trajectories=gen.outputs["Output"],
                skills=sk.output,
                rescored=rs.outputs["Output"],
            )
            for task, name in (
                (gen, "generate"),
                (sk, "extract-skills"),
                (rs, "rescore"),
                (tr, "train"),
                (ev, "evaluate"),
                (rg, "register"),
            ):
                task.set_display_name(f"{name} (round {r})")
                task.set_caching_options(False)
            adapter = tr.outputs["Output"]
            skills = sk.output
            version = rg.output
        return version

    return sdar_training
