"""Component ``prepare``: validate the run's settings once and store the pipeline config (the first task)."""

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def prepare(
    storage: str,
    base_model: str,
    run_id: str,
    registry: str,
    seed_skills: str,
    start_adapter: str,
    policy_name: str,
    env: str,
    tasks: int,
    group_size: int,
    max_turns: int,
    method: str,
    lam: float,
    beta: float,
    lr: float,
    lora_rank: int,
    train_steps: int,
    kl_coef: float,
    entropy_coef: float,
    options: str,
    format_guard: str,
    rollout_engine: str,
    train_engine: str,
    retrieval: str,
    eval_tasks: int,
    eval_samples: int,
    promote_to: str,
    gate_min_gain: float,
    gate_passk_tolerance: float,
    gate_ood_tolerance: float,
    gate_floor: float,
    seed: int,
    tracking_uri: str,
    shards: int,
    stage_settings: dict,
) -> str:
    params = dict(locals())  # first statement: exactly the pipeline parameters
    from sdarflow.pipeline_config import PipelineConfig, prepare

    return prepare(PipelineConfig.from_dict(params))
