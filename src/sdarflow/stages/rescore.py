"""Stage ``rescore``: ``old_logprobs`` (policy, plain context), ``teacher_logprobs`` (same policy with retrieved
skills in its context) and ``ref_logprobs`` (the base model, adapter off, plain context: the KL term's reference) for
every response token, plus ``skill_ids`` and whether a task-specific skill was found.

Sanity guards (``sdarflow.teacher.report``) fail the stage before anything is published; the output folder gets
``report.md`` and ``report.html`` beside the Parquet parts, written before the manifest publishes the dataset.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pyarrow as pa

from sdarflow import storage
from sdarflow.algo import Objective
from sdarflow.config import MAX_SEED, StageConfig, opt
from sdarflow.errors import ConfigError
from sdarflow.models.device import device_opt, model_device, precision_opt, resolve_device, weights_dtype
from sdarflow.rollout.prompt import SKILL_PLACES
from sdarflow.schema import EXPERT_POLICY, RESCORE_FIELDS, RESCORED_SCHEMA, TRAJECTORY_SCHEMA, check_vocab
from sdarflow.skills.retrieve import STRATEGIES, get_strategy
from sdarflow.stages.common import allow_unpublished_opt, load_skills, local_artifact, once, require
from sdarflow.teacher import PRIVILEGED_CONTEXTS, TEACHER_CONTEXTS, TEACHER_WEIGHTS
from sdarflow.teacher.discrimination import (
    discrimination,
    discrimination_metrics,
    discrimination_rows,
    turn_scores,
)
from sdarflow.teacher.report import GuardSettings, check_retrieval, check_scores, rescore_summary
from sdarflow.teacher.rescore import BATCHINGS, k1_mean, padding_share, reference_model, score
from sdarflow.teacher.synthetic import synthetic_teacher

log = logging.getLogger(__name__)


@dataclass
class RescoreConfig(StageConfig, GuardSettings):
    stage = "rescore"
    input: list[str] = opt([], "trajectory dataset URI(s)", reads=True)
    skills: str = opt("", "skill library (published URI or folder)", reads=True)
    model: str = opt("", "base model HF folder", reads=True)
    adapter: str = opt(
        "",
        "the adapter (or full fine-tune) that generated the trajectories (the policy being trained)",
        reads=True,
    )
    output: str = opt("", "output rescored dataset URI", io=True)
    retrieval: str = opt("keyword", "skill retrieval strategy", choices=tuple(STRATEGIES))
    teacher: str = opt(
        "current",
        "the teacher's weights: current (the student's, as SDAR) or ema (the adapter's moving average, from train "
        "--ema-decay); either way with skills in its prompt",
        choices=TEACHER_WEIGHTS.names(),
    )
    ucb_c: float = opt(0.5, "ucb retrieval: exploration weight c in mean + c*sqrt(ln N / n); >= 0", ge=0)
    seed: int = opt(
        0,
        "seed of random retrieval's skill draws and of the synthetic teacher's label flips",
        ge=0,
        le=MAX_SEED,
    )
    teacher_context: str = opt(
        "skills",
        "what the teacher knows that the student does not: skills (retrieved skills in its prompt, SDAR's), "
        "solution (the task's gold solution from the env, at --skill-place; train rows only) or synthetic (the "
        "machinery's control: the student with the sampled token's logit raised by --synthetic-delta on turns "
        "whose action is the expert's and lowered elsewhere; train rows only)",
        choices=TEACHER_CONTEXTS,
    )
    synthetic_delta: float = opt(1.0, "synthetic teacher: the logit shift in nats", ge=0)
    synthetic_label_noise: float = opt(
        0.0,
        "synthetic teacher: probability that a turn's expert label is flipped (0.5 keeps the statistics and "
        "removes the content)",
        ge=0,
        le=1,
    )
    skill_place: str = opt(
        "prefix",
        "where the teacher's skills go: prefix (before the rendered prompt, as the SDAR reference), system or user",
        choices=SKILL_PLACES,
    )
    max_prompt_tokens: int = opt(
        2048,
        "teacher prompt keeps its last N tokens, the reference's data.max_prompt_length (reference scripts: 2048 "
        "for ALFWorld/WebShop, 4096 for search); >= 1",
        ge=1,
    )
    ref_logprobs: bool = opt(
        True,
        "compute the reference policy's log-probs (base model, adapter disabled, no skills) for the trainer's KL "
        "term (--kl-coef); false saves a forward pass, then train needs --kl-coef 0",
    )
    ppl_delta: bool = opt(
        False,
        "score each turn's perplexity-delta reward (column ppl_delta, for train --reward perplexity-delta): the "
        "drop in the policy's log-perplexity on the env's reference continuation across the turn; search-qa",
    )
    batching: str = opt(
        "packed", "packed (rows end to end, block-diagonal attention) or padded", choices=BATCHINGS
    )
    max_batch_tokens: int = opt(
        0,
        "tokens per forward pass (rows x padded width); 0 = 16384 on a GPU, 4096 on a CPU (where larger batches "
        "fall out of the cache: 16384 ran 1.6x slower than 4096 on 2 cores)",
        ge=0,
    )

    device: str = device_opt()
    # These log-probs are the PPO ratio's old policy and the KL's reference; the trainer computes the new ones
    # from bf16 weights on a GPU too (the frozen base, DeepSpeed's bf16 copies), so the ratio starts at 1 within
    # bf16's error either way, at half the memory and twice the speed of fp32.
    precision: str = precision_opt("the weights the log-probs are taken with (float32 log-probs either way)")
    pack_length: int = opt(0, "packed bin size in tokens; 0 = the longest row", ge=0)
    shard: int = opt(
        0, "this task's shard index in [0, num_shards): rows of every num_shards-th group", io=True, ge=0
    )
    num_shards: int = opt(1, "shards the rows are split over (one KFP task each)", io=True, ge=1)
    allow_unpublished: bool = allow_unpublished_opt()
    overwrite: bool = opt(False, "replace an existing dataset at --output", io=True)

    def validate(self) -> None:
        if self.shard >= self.num_shards:
            raise ConfigError(
                f"rescore: shard ({self.shard}) must be in [0, num_shards={self.num_shards}); fix: --shard 0 to "
                f"{self.num_shards - 1}"
            )


Config = RescoreConfig  # the stage's exports are Config and run (sdarflow.stages)


def _train_rows_only(table: pa.Table, context: str) -> None:
    """A teacher context of :data:`PRIVILEGED_CONTEXTS` reads what only training may see: refuse (one line, before
    anything is written) rows of any split but train."""
    other = sorted({s for s in table["split"].to_pylist() if s != "train"}, key=str)
    if other:
        raise ConfigError(
            f"rescore --teacher-context {context}: the input has rows of split {', '.join(map(str, other))}; only "
            f"train rollouts may be taught with it; fix: rescore the train split's generate output"
        )


def _shard(table: pa.Table, shard: int, num_shards: int) -> pa.Table:
    """Every ``num_shards``-th GRPO group (in sorted group order), so a group's rows stay together."""
    if num_shards == 1:
        return table
    group_ids = table["group_id"].to_pylist()
    mine = set(sorted(set(group_ids))[shard::num_shards])
    return table.filter(pa.array([g in mine for g in group_ids], type=pa.bool_()))


def _run_metrics(
    cfg: RescoreConfig,
    table: pa.Table,
    old: list[list[float]],
    ref: list[list[float]] | None,
    lengths: list[int],
    seconds: float,
    overridden,
    budget: int,
) -> dict[str, float]:
    rollout = table["rollout_logprobs"].to_pylist()
    drift = [abs(a - b) for ro, o in zip(rollout, old, strict=True) for a, b in zip(ro, o, strict=True)]
    # How far the policy has moved from the base model (k1 estimate of KL): what --kl-coef pulls back on.
    kl = {"rescore/ref_kl_mean": k1_mean(old, ref)} if ref is not None else {}
    return {
        **kl,
        # Engine vs trainer log-probs of the same tokens: silent off-policy error if it grows.
        "rescore/engine_logprob_gap_abs": sum(drift) / max(1, len(drift)),
        "rescore/padding_share": padding_share(lengths, budget, cfg.batching, cfg.pack_length),
        "rescore/forward_tokens_per_s": sum(lengths) / max(seconds, 1e-9),
        "rescore/seconds": seconds,
        "rescore/guards_overridden": float(len(overridden)),
    }


@once("rescored")
def run(cfg: RescoreConfig) -> dict:
    from sdarflow.extensions.ppl_delta import rescore_column
    from sdarflow.models import load_policy
    from sdarflow.teacher.rescore import teacher_prompts
    from sdarflow.teacher.solution import task_solutions

    require("rescore", input=cfg.input, skills=cfg.skills, model=cfg.model, output=cfg.output)
    table = _shard(
        storage.read_table(cfg.input, kind="trajectories", schema=TRAJECTORY_SCHEMA),
        cfg.shard,
        cfg.num_shards,
    )
    context = cfg.teacher_context
    synthetic = context == "synthetic"
    if context in PRIVILEGED_CONTEXTS:
        _train_rows_only(table, context)
    if EXPERT_POLICY in table["policy_version"].to_pylist():
        raise ConfigError(
            f"rescore: {cfg.input} holds expert walkthrough rows (generate --policy expert), which no policy "
            f"sampled, so RL cannot learn from them; fix: train --mode sft on them, and rescore the policy's rollouts"
        )
    rows = table.select(
        ["prompt_token_ids", "response_token_ids", "prompt_messages", "task_type", "env", "split", "task_id"]
    ).to_pylist()
    # Only the skills teacher retrieves skills; the others' rows carry no skill ids, so no skill is credited with
    # what a solution or the synthetic control taught (the ucb statistics of a later round's retrieval)
    texts = None
    if context == "solution":
        texts = task_solutions(rows)  # an env without solutions fails here, before the model loads
    elif synthetic:
        texts = [""] * len(rows)
    lib = load_skills(cfg.skills, cfg.allow_unpublished)
    adapter = local_artifact(cfg.adapter, "adapter", cfg.allow_unpublished, full_model=True)
    dtype = weights_dtype(cfg.precision, resolve_device(cfg.device))
    policy = load_policy(
        cfg.model, adapter, device=cfg.device, dtype=dtype, flash_attention=cfg.batching == "padded"
    )
    check_vocab(
        table,
        policy.model.get_input_embeddings().weight.shape[0],
        f"dataset {', '.join(cfg.input)}",
        cfg.model,
    )
    task_types = [r["task_type"] for r in rows]
    strategy = get_strategy(cfg.retrieval, seed=cfg.seed, ucb_c=cfg.ucb_c)
    teach = teacher_prompts(
        rows, lib, strategy, policy.tokenizer, cfg.skill_place, cfg.max_prompt_tokens, texts
    )
    overridden: list[str] = []
    if context == "skills":
        check_retrieval(lib, teach.hits, task_types, cfg, overridden)

    ppl = rescore_column(cfg, table, policy)
    prompts = None if synthetic else teach.prompts
    old, teacher, ref, seconds, budget, lengths = _score_passes(cfg, policy, rows, prompts, adapter)
    if synthetic:
        labels = table["expert_match"].to_pylist()
        rounds = sorted(set(table["round"].to_pylist()))
        flips = f"{cfg.seed}/{cfg.shard}/{rounds}"  # each shard and round its own label flips
        teacher, _ = synthetic_teacher(old, labels, cfg.synthetic_delta, cfg.synthetic_label_noise, flips)
    vocab = int(policy.model.get_output_embeddings().weight.shape[0])
    check_scores(old, teacher, vocab, 0 if synthetic else teach.unchanged, cfg, overridden)

    summary = rescore_summary(old, teacher, task_types, teach.hits, teach.matched, teach.skill_ids, seconds)
    summary.metrics.update(_run_metrics(cfg, table, old, ref, lengths, seconds, overridden, budget))
    contrasts = _discrimination(table, old, teacher)
    summary.metrics.update(discrimination_metrics(contrasts))
    summary.discrimination = discrimination_rows(contrasts)
    summary.info = _info(cfg, lib, overridden)
    new_cols = _columns(old, teacher, ref, teach, ppl(budget) if ppl else None)
    _write(cfg, table, new_cols, summary, lib.version, overridden)
    hits = summary.metrics["rescore/retrieval_hit_rate"]
    log.info(
        "rescore: %d rows, teacher %s, gap mean %.4f, hit rate %s, %.0f tokens/s -> %s",
        table.num_rows,
        context,
        summary.metrics["rescore/gap_mean"],
        f"{hits:.2f}" if context == "skills" else "n/a (no retrieval)",
        summary.metrics["rescore/tokens_per_s"],
        cfg.output,
    )
    log.info(
        "rescore: teacher discrimination, gate: expert - other %s, success - failure %s",
        contrasts["expert"]["gate"].text(),
        contrasts["success"]["gate"].text(),
    )
    return {
        "uri": cfg.output,
        "rows": table.num_rows,
        "metrics": summary.metrics,
        "skill_library": lib.version,
    }


def _discrimination(table: pa.Table, old: list, teacher: list) -> dict:
    """The teacher's discrimination (:mod:`sdarflow.teacher.discrimination`) on the rows, at the train stage's
    default gate sharpness (the paper's beta)."""
    labels = table.select(["task_id", "success", "expert_match"]).to_pydict()
    turns = turn_scores(
        labels["task_id"], labels["success"], labels["expert_match"], old, teacher, Objective.gate_beta
    )
    return discrimination(turns)


def _columns(old: list, teacher: list, ref: list | None, teach, ppl_delta: list | None) -> dict[str, list]:
    """The columns rescore adds (:data:`sdarflow.schema.RESCORE_FIELDS`); null where a pass did not run."""
    nulls = [None] * len(old)
    return {
        "old_logprobs": old,
        "teacher_logprobs": teacher,
        "ref_logprobs": ref if ref is not None else nulls,
        "progress": _progress(old, ref) if ref is not None else nulls,
        "ppl_delta": ppl_delta if ppl_delta is not None else nulls,
        "skill_ids": teach.skill_ids,
        "skill_hit": teach.hits,
    }


def _progress(old: list[list[float]], ref: list[list[float]]) -> list[float]:
    """Each turn's progress (:func:`sdarflow.algo.turn_progress`), from its rescored log-probs."""
    import torch

    from sdarflow.algo import turn_progress

    out = []
    for o, r in zip(old, ref, strict=True):
        ones = torch.ones(1, len(o))
        out.append(float(turn_progress(torch.tensor([o]), torch.tensor([r]), ones)[0]) if o else 0.0)
    return out


def _score_passes(
    cfg: RescoreConfig, policy, rows: list[dict], teacher_prompts: list[list[int]] | None, adapter: str | None
):
    """(student, teacher or None, reference or None) log-probs of every row's response, the seconds they took, the
    token budget of a batch and the tokens of every scored sequence. No teacher pass without ``teacher_prompts``
    (a teacher that reads nothing). Without an adapter the reference is the student itself (the scored policy is
    then the base model, so a second pass would give the same numbers)."""
    t0 = time.perf_counter()
    prompts = [r["prompt_token_ids"] for r in rows]
    responses = [r["response_token_ids"] for r in rows]
    budget = cfg.max_batch_tokens or (16384 if model_device(policy.model).type == "cuda" else 4096)
    pad, kw = policy.tokenizer.pad_token_id, {"batching": cfg.batching, "pack_length": cfg.pack_length}

    def scored(model, contexts: list[list[int]], desc: str) -> list[list[float]]:
        return score(model, contexts, responses, pad, budget, desc, **kw)

    old = scored(policy.model, prompts, "rescore student")
    teacher = None
    if teacher_prompts is not None:
        with TEACHER_WEIGHTS.get(cfg.teacher)(policy.model, adapter):
            teacher = scored(policy.model, teacher_prompts, "rescore teacher")
    ref = old if cfg.ref_logprobs else None
    if cfg.ref_logprobs and cfg.adapter:
        with reference_model(policy.model, cfg.model, cfg.batching == "padded") as ref_model:
            ref = scored(ref_model, prompts, "rescore reference")
    passes = [prompts, *([teacher_prompts] if teacher_prompts is not None else [])]
    passes += [prompts] if cfg.ref_logprobs and cfg.adapter else []
    lengths = [len(p) + len(r) for pass_ in passes for p, r in zip(pass_, responses, strict=True)]
    return old, teacher, ref, time.perf_counter() - t0, budget, lengths


def _info(cfg: RescoreConfig, lib, overridden: list[str]) -> dict[str, str]:
    """The settings the report shows beside its numbers."""
    if not cfg.ref_logprobs:
        reference = "not computed (train needs --kl-coef 0)"
    elif cfg.adapter:
        reference = "base model (adapter disabled, or loaded beside a full fine-tune)"
    else:
        reference = "= old log-probs (no adapter: the policy is the base)"
    context = cfg.teacher_context
    if context == "synthetic":
        context += f" (logit shift {cfg.synthetic_delta:g} nats, label noise {cfg.synthetic_label_noise:g})"
    return {
        "teacher context": context,
        "retrieval": cfg.retrieval
        if cfg.teacher_context == "skills"
        else "none (this teacher reads no skills)",
        "skill place": f"{cfg.skill_place} (teacher prompt: last {cfg.max_prompt_tokens} tokens)",
        "reference log-probs": reference,
        "skill library": f"{lib.version} ({len(lib.skills)} skills)",
        "batching": cfg.batching,
        "guards overridden": ", ".join(overridden) or "none",
    }


def _write(
    cfg: RescoreConfig, table: pa.Table, new_cols: dict, summary, library_version: str, overridden: list[str]
) -> None:
    """Publish the trajectories with the rescored columns added, and the report beside them."""
    from sdarflow import report
    from sdarflow.teacher.report import rescore_report

    doc = rescore_report(summary)
    for f in RESCORE_FIELDS:
        table = table.append_column(f, pa.array(new_cols[f.name], type=f.type))

    storage.write_table(
        table,
        cfg.output,
        kind="rescored",
        schema=RESCORED_SCHEMA,
        config_hash=cfg.config_hash(),
        inputs=[*cfg.input, cfg.skills, cfg.model] + ([cfg.adapter] if cfg.adapter else []),
        overwrite=cfg.overwrite,
        attachments={
            "report.md": report.markdown(doc).encode(),
            "report.html": report.html(doc).encode(),
        },
        metrics=summary.metrics,
        skill_library=library_version,
        guards_overridden=overridden,
        teacher_context=cfg.teacher_context,
    )
