"""Arrow schemas for every table sdarflow writes, and validation with errors that name the bad column.

Trajectories are turn-level: one row = one agent turn = one training sample (see ARCHITECTURE.md, Data contracts).
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from sdarflow.errors import SchemaError

TRAJECTORY_FIELDS: list[pa.Field] = [
    pa.field("run_id", pa.string()),
    pa.field("round", pa.int32()),
    pa.field("task_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("traj_id", pa.string()),
    pa.field("turn", pa.int32()),
    pa.field("task_type", pa.string()),
    pa.field("split", pa.string()),
    pa.field("prompt_token_ids", pa.list_(pa.int32())),
    pa.field("response_token_ids", pa.list_(pa.int32())),
    pa.field("response_text", pa.string()),
    pa.field("rollout_logprobs", pa.list_(pa.float32())),
    pa.field("reward", pa.float32()),
    pa.field("episode_return", pa.float32()),
    pa.field("success", pa.bool_()),
    pa.field("format_ok", pa.bool_()),
    pa.field("policy_version", pa.string()),
    # Chat messages (JSON list of {role, content}) that rendered prompt_token_ids. The teacher re-renders them with
    # skills inserted, so the privileged context is added at the message level, not spliced into token ids.
    pa.field("prompt_messages", pa.string()),
    pa.field("env", pa.string()),
    pa.field("num_turns", pa.int32()),
    # The env's expert action at the state this turn's prompt shows, and whether the policy's parsed action was it
    # (generate --expert-labels): what rescore measures the teacher's discrimination against; null where the env
    # has no expert or labels were not recorded.
    pa.field("expert_action", pa.string()),
    pa.field("expert_match", pa.bool_()),
]

RESCORE_FIELDS: list[pa.Field] = [
    pa.field("old_logprobs", pa.list_(pa.float32())),
    pa.field("teacher_logprobs", pa.list_(pa.float32())),
    # The reference policy (base model, adapter off, no skills) for the KL term; null where rescore skipped it.
    pa.field("ref_logprobs", pa.list_(pa.float32())),
    # The turn's progress, sum_t (old_logprobs - ref_logprobs): how far training has moved this action from the
    # base model (sdarflow.algo.turn_progress), for failure attribution; null without reference log-probs.
    pa.field("progress", pa.float32()),
    # The turn's perplexity-delta reward (rescore --ppl-delta, sdarflow.extensions.ppl_delta); null when not
    # scored, and for an episode's last turn (no context after it).
    pa.field("ppl_delta", pa.float32()),
    pa.field("skill_ids", pa.list_(pa.string())),
    # False when only general skills were found for the row's task type (the silent retrieval failure mode).
    pa.field("skill_hit", pa.bool_()),
]

TRAJECTORY_SCHEMA = pa.schema(TRAJECTORY_FIELDS)
RESCORED_SCHEMA = pa.schema(TRAJECTORY_FIELDS + RESCORE_FIELDS)

SCHEMAS: dict[str, pa.Schema] = {"trajectories": TRAJECTORY_SCHEMA, "rescored": RESCORED_SCHEMA}

# The policy_version of rows no policy sampled (generate --policy expert: walkthroughs for SFT); their
# rollout_logprobs are NaN.
EXPERT_POLICY = "expert"

# Per-token columns that must have one entry per response token.
_TOKEN_ALIGNED = ("rollout_logprobs", "old_logprobs", "teacher_logprobs", "ref_logprobs")


def fingerprint(schema: pa.Schema) -> str:
    """Short stable hash of column names and types (metadata ignored)."""
    text = ";".join(f"{f.name}:{f.type}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def validate(table: pa.Table, schema: pa.Schema, dataset: str) -> pa.Table:
    """``table`` checked against ``schema``, its columns in schema order (extra columns dropped); a SchemaError
    names ``dataset`` and the first missing/mistyped column or misaligned row."""
    for field in schema:
        if field.name not in table.column_names:
            raise SchemaError(
                f"{dataset}: missing required column '{field.name}' ({field.type}); "
                f"fix: regenerate the dataset with the stage that writes it"
            )
        actual = table.schema.field(field.name).type
        if actual != field.type:
            raise SchemaError(
                f"{dataset}: column '{field.name}' has type {actual}, expected {field.type}; "
                f"fix: write it with sdarflow's schema (sdarflow.schema)"
            )
    table = table.select(schema.names)
    _check_token_alignment(table, dataset)
    _check_values(table, dataset)
    return table


# A log-probability is <= 0; float32 log_softmax may round a near-certain token a hair above it.
_LOGPROB_MAX = 1e-3


def _first_bad(column: pa.ChunkedArray, bad_value, rows: pa.Array | None = None) -> int | None:
    """The row of ``column`` (a list column; only the ``rows`` that are true, when given) holding the first value
    for which ``bad_value`` is true, or None."""
    column = column.combine_chunks()
    values = pc.list_flatten(column)
    if len(values) == 0:
        return None
    parents = pc.list_parent_indices(column)
    bad = bad_value(values)
    if rows is not None:
        bad = pc.and_(bad, pc.take(rows, parents))
    if not pc.any(bad).as_py():
        return None
    return parents[pc.index(bad, True).as_py()].as_py()


def _check_values(table: pa.Table, dataset: str) -> None:
    """Values no model writes: a log-prob that is NaN, infinite or above 0 (it would train and publish, or put NaN
    in a manifest; an expert row's rollout log-probs are NaN, as no policy sampled it), a negative token id."""
    sampled = None
    if "policy_version" in table.column_names:
        sampled = pc.not_equal(table["policy_version"], EXPERT_POLICY).combine_chunks().fill_null(True)
    for name in _TOKEN_ALIGNED:
        if name in table.column_names:
            row = _first_bad(
                table[name],
                lambda v: pc.or_(pc.invert(pc.is_finite(v)), pc.greater(v, _LOGPROB_MAX)),
                sampled if name == "rollout_logprobs" else None,
            )
            if row is not None:
                raise SchemaError(
                    f"{dataset}: row {row} has a '{name}' value that is not a log-probability (NaN, infinite or "
                    f"above 0); fix: regenerate the dataset with the stage that writes it"
                )
    for name in ("prompt_token_ids", "response_token_ids"):
        if (
            name in table.column_names
            and (row := _first_bad(table[name], lambda v: pc.less(v, 0))) is not None
        ):
            raise SchemaError(f"{dataset}: row {row} has a negative '{name}'; fix: regenerate the dataset")


def check_vocab(table: pa.Table, vocab_size: int, dataset: str, model: str) -> None:
    """SchemaError unless every token id of ``table`` is below ``vocab_size`` (the model's): an id beyond it
    would end as an IndexError in the embedding."""
    for name in ("prompt_token_ids", "response_token_ids"):
        if name in table.column_names:
            row = _first_bad(table[name], lambda v: pc.greater_equal(v, vocab_size))
            if row is not None:
                raise SchemaError(
                    f"{dataset}: row {row} has a '{name}' id >= the vocabulary size {vocab_size} of model "
                    f"'{model}'; fix: pass the base model the dataset was generated with"
                )


def _check_token_alignment(table: pa.Table, dataset: str) -> None:
    if table.num_rows == 0:
        return
    expected = pc.list_value_length(table["response_token_ids"])
    for name in _TOKEN_ALIGNED:
        if name not in table.column_names:
            continue
        lengths = pc.list_value_length(table[name])
        bad = pc.not_equal(lengths, expected)
        if pc.any(bad).as_py():
            row = pc.index(bad, True).as_py()
            raise SchemaError(
                f"{dataset}: row {row} has {lengths[row].as_py()} '{name}' for "
                f"{expected[row].as_py()} response tokens; fix: lists must align with response_token_ids"
            )


def check_turns_unique(table: pa.Table, datasets: str) -> None:
    """Turn rows (trajectories, rescored) are keyed by (traj_id, turn): a key twice (a dataset passed twice, or two
    runs sharing a run id) would pair one episode's turn with another's next turn and count episodes twice."""
    if not {"traj_id", "turn"} <= set(table.column_names) or table.num_rows == 0:
        return
    counts = table.group_by(["traj_id", "turn"]).aggregate([([], "count_all")])
    if counts.num_rows == table.num_rows:
        return
    repeated = counts.filter(pc.greater(counts["count_all"], 1)).slice(0, 1).to_pylist()[0]
    raise SchemaError(
        f"{datasets}: turn {repeated['turn']} of episode {repeated['traj_id']} appears "
        f"{repeated['count_all']} times (a dataset passed twice, or two runs with one run id); fix: pass each dataset "
        f"once, and give every run its own --run-id"
    )
