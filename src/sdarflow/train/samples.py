"""Rescored turn rows -> RL training samples: each row's GRPO advantage (as verl-agent computes it), optionally
re-credited or filtered by a research option, and the sample the trainer takes. Credit assigners, row filters and
token advantages plug in by name; the built-in options live in :mod:`sdarflow.extensions`, imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sdarflow import storage
from sdarflow.algo import episode_length_scale, grpo_advantages, penalized_scores
from sdarflow.errors import ConfigError
from sdarflow.names import NameRegistry
from sdarflow.schema import RESCORED_SCHEMA, SCHEMAS

# (the rows' GRPO advantages, the rows) -> each row's advantage
CreditFn = Callable[[torch.Tensor, list[dict]], torch.Tensor]
CREDIT_ASSIGNERS: NameRegistry[CreditFn] = NameRegistry("credit assigner")
CREDIT_ASSIGNERS.register("outcome")(lambda advantages, rows: advantages)  # GRPO: each turn its episode's
CREDIT_ASSIGNERS.add_lazy("scpo", "sdarflow.extensions.credit:scpo_credit")

# (the rows, their GRPO scores, each row's state value from a learned head or None) -> which rows leave the update
FilterFn = Callable[[list[dict], torch.Tensor, torch.Tensor | None], list[bool]]
ROW_FILTERS: NameRegistry[FilterFn] = NameRegistry("row filter")
ROW_FILTERS.register("none")(lambda rows, scores, values: [False] * len(rows))
ROW_FILTERS.add_lazy("negative-value", "sdarflow.extensions.filters:negative_value_rows")

# (the advantages broadcast over the response tokens, old log-probs, reference log-probs, mask) -> per-token
# advantages; the registry maps a name to a factory of that function from the train config (None: no token term)
TokenAdvantages = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
TOKEN_ADVANTAGES: NameRegistry[Callable[..., TokenAdvantages | None]] = NameRegistry("advantage")
TOKEN_ADVANTAGES.register("outcome")(lambda cfg: None)
TOKEN_ADVANTAGES.add_lazy("progress", "sdarflow.extensions.progress:progress_term")

REWARDS = ("outcome", "perplexity-delta")
EPISODE_WEIGHTS = ("tokens", "equal")


def read_rows(
    mode: str, inputs: list[str], task_id: bool = False, what: str = "train --mode sft"
) -> list[dict]:
    """The rows train reads from its ``inputs``: RL needs rescored rows; SFT needs only prompts, responses and
    success (and with ``task_id``, the task), so trajectories work too. ``what`` names the inputs in errors."""
    if mode == "rl":
        return storage.read_table(inputs, kind="rescored", schema=RESCORED_SCHEMA).to_pylist()
    rows: list[dict] = []
    for uri in inputs:
        kind = storage.read_manifest(uri).get("kind")
        if kind not in SCHEMAS:
            raise ConfigError(
                f"{what}: '{uri}' holds a {kind!r} artifact; fix: pass a trajectories or rescored dataset"
            )
        table = storage.read_table(uri, kind=kind, schema=SCHEMAS[kind])
        columns = ["prompt_token_ids", "response_token_ids", "success", *(["task_id"] if task_id else [])]
        rows += table.select(columns).to_pylist()
    return rows


@dataclass
class RLSample:
    prompt: list[int]
    response: list[int]
    old_logprobs: list[float]
    teacher_logprobs: list[float]
    advantage: float
    ref_logprobs: list[float] | None = None


def row_scores(rows: list[dict], penalty: float, reward_coef: float = 0.0) -> torch.Tensor:
    """Each row's GRPO score: its episode's return minus the invalid-action penalty, plus ``reward_coef`` times
    its turn reward (``ppl_delta``; a null one counts 0)."""
    scores = penalized_scores(
        torch.tensor([float(r["episode_return"]) for r in rows], dtype=torch.float32),
        torch.tensor([bool(r["format_ok"]) for r in rows]),
        penalty,
    )
    if reward_coef:
        scores = scores + reward_coef * torch.tensor([r.get("ppl_delta") or 0.0 for r in rows])
    return scores


def row_advantages(
    rows: list[dict],
    norm_by_std: bool = True,
    penalty: float = 0.0,
    per_episode: bool = False,
    credit: str = "outcome",
    reward_coef: float = 0.0,
    episode_weight: str = "tokens",
) -> list[float]:
    """GRPO advantage of each turn row: its :func:`row_scores` standardised within its group over rows (or over
    episodes, one score each, with ``per_episode``), then re-credited by the ``credit`` assigner; with
    ``episode_weight`` "equal", scaled by :func:`~sdarflow.algo.episode_length_scale` so that every episode weighs
    the same in the token-mean policy gradient ("tokens": each token its episode's advantage, as the reference)."""
    groups = [r["group_id"] for r in rows]
    trajs = [r["traj_id"] for r in rows]
    adv = grpo_advantages(
        row_scores(rows, penalty, reward_coef),
        groups,
        norm_by_std=norm_by_std,
        traj_ids=trajs if per_episode else None,
    )
    adv = CREDIT_ASSIGNERS.get(credit)(adv, rows)
    if episode_weight == "equal":
        adv = adv * episode_length_scale(_response_tokens(rows), groups, trajs)
    return adv.tolist()


def _response_tokens(rows: list[dict]) -> torch.Tensor:
    return torch.tensor([len(r["response_token_ids"] or ()) for r in rows], dtype=torch.float32)


def advantage_stats(rows: list[dict], advantages: list[float]) -> dict[str, float]:
    """What GRPO has to learn from: the share of groups whose rows all got advantage 0 (every rollout scored
    alike, so the group gives no policy gradient), the spread of the row advantages, and their mean over response
    tokens (what a token-mean update pushes on net)."""
    groups: dict[str, list[float]] = {}
    for r, a in zip(rows, advantages, strict=True):
        groups.setdefault(r["group_id"], []).append(a)
    zero = sum(all(abs(a) < 1e-6 for a in values) for values in groups.values())
    t = torch.tensor(advantages, dtype=torch.float64)
    tokens = _response_tokens(rows).to(torch.float64)
    return {
        "adv/zero_group_share": zero / max(1, len(groups)),
        # < 0: the token-mean update lowers the sampled tokens' probability on net (long failures outweigh)
        "adv/token_weighted_mean": float((t * tokens).sum() / tokens.sum()) if tokens.sum() > 0 else 0.0,
        "adv/std": float(t.std()) if t.numel() > 1 else 0.0,
        "adv/abs_mean": float(t.abs().mean()) if t.numel() else 0.0,
    }


def make_samples(
    rows: list[dict], advantages: list[float] | None = None, dropped: list[bool] | None = None
) -> list[RLSample]:
    """Training samples from rescored rows with their :func:`row_advantages` (default settings when None): every
    row counts in the advantages (as in the reference), but only rows with a response train, and none ``dropped``."""
    adv = row_advantages(rows) if advantages is None else advantages
    drop = dropped or [False] * len(rows)
    return [
        RLSample(
            r["prompt_token_ids"],
            r["response_token_ids"],
            r["old_logprobs"],
            r["teacher_logprobs"],
            a,
            r.get("ref_logprobs"),
        )
        for r, a, d in zip(rows, adv, drop, strict=True)
        if r["response_token_ids"] and not d
    ]
