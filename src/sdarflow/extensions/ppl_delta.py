"""The perplexity-delta turn reward (rescore ``--ppl-delta``): how much each turn made the task's solution likelier.

For a turn t of an episode, the policy scores the task's reference continuation (the env's
``reference_continuation``, e.g. ``answer[gold]`` on search-qa) after the context turn t started from (its prompt)
and after the context turn t + 1 starts from (which holds turn t's action and observation); the reward is the
drop in mean negative log-likelihood (:func:`perplexity_delta`). It gives intermediate turns a
signal where the env rewards only the end. An episode's last turn has no context after it: null.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sdarflow.errors import ConfigError, ModelError

Scorer = Callable[[list[list[int]], list[list[int]]], list[list[float]]]  # (prompts, responses) -> log-probs


def references(rows: list[dict], tokenizer, eos_id: int) -> dict[str, list[int]]:
    """task_id -> the token ids of its reference continuation (+ eos, as a response ends)."""
    from sdarflow.envs import get_suite

    suites: dict[str, object] = {}
    out: dict[str, list[int]] = {}
    for r in rows:
        if r["task_id"] in out:
            continue
        if r["env"] not in suites:  # a suite may build an index: once per env
            suites[r["env"]] = get_suite(r["env"])
        suite = suites[r["env"]]
        text = (
            suite.reference_continuation(r["task_id"]) if hasattr(suite, "reference_continuation") else None
        )
        if text is None:
            raise ConfigError(
                f"rescore --ppl-delta: env {r['env']!r} gives no reference continuation for task {r['task_id']}; "
                f"fix: drop --ppl-delta for this env (search-qa has one)"
            )
        out[r["task_id"]] = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_id]
    return out


def _mean_nll(logprobs: list[list[float]]) -> torch.Tensor:
    return torch.tensor([-sum(lp) / len(lp) for lp in logprobs], dtype=torch.float64)


def ppl_delta_rewards(rows: list[dict], refs: dict[str, list[int]], score: Scorer) -> list[float | None]:
    """Each row's reward (rows: ``traj_id``, ``turn``, ``task_id``, ``prompt_token_ids``); null on last turns."""
    by_turn = {(r["traj_id"], int(r["turn"])): i for i, r in enumerate(rows)}
    pairs = [(i, by_turn[(r["traj_id"], int(r["turn"]) + 1)]) for i, r in enumerate(rows)
             if (r["traj_id"], int(r["turn"]) + 1) in by_turn]  # fmt: skip
    if not pairs:
        return [None] * len(rows)
    targets = [refs[rows[i]["task_id"]] for i, _ in pairs]
    before = score([rows[i]["prompt_token_ids"] for i, _ in pairs], targets)
    after = score([rows[j]["prompt_token_ids"] for _, j in pairs], targets)
    rewards = perplexity_delta(_mean_nll(before), _mean_nll(after))
    if not torch.isfinite(rewards).all():  # a NaN would turn its group's advantages NaN in train
        bad = int((~torch.isfinite(rewards)).sum())
        raise ModelError(
            f"rescore --ppl-delta: the policy's NLL of the reference continuation is not finite for {bad} of "
            f"{len(pairs)} turns (a diverged adapter); fix: rescore with an earlier adapter, or drop --ppl-delta"
        )
    rewards = rewards.tolist()
    out: list[float | None] = [None] * len(rows)
    for (i, _), reward in zip(pairs, rewards, strict=True):
        out[i] = reward
    return out


def perplexity_delta(nll_before: Tensor, nll_after: Tensor) -> Tensor:
    """OPERA-style turn reward: the drop in the policy's log-perplexity on the task's reference continuation,
    ``r_t = NLL(ref | context before turn t) - NLL(ref | context after turn t)``, each the mean per-token negative
    log-likelihood. Positive: the turn (its action and what it observed) made the solution likelier. (N,) -> (N,).
    """
    return (nll_before - nll_after).detach()


def rescore_column(cfg, table, policy) -> Callable[[int], list[float | None]] | None:
    """rescore's hook: with ``--ppl-delta``, the function that scores the ``ppl_delta`` column (rows' rewards by the
    student policy) at a forward's token budget; the tasks' reference continuations are looked up now, before any
    scoring pass, so an env without one fails at once. None without ``--ppl-delta``."""
    from sdarflow.teacher.rescore import score

    if not cfg.ppl_delta:
        return None
    rows = table.select(["traj_id", "turn", "task_id", "env", "prompt_token_ids"]).to_pylist()
    refs = references(rows, policy.tokenizer, policy.eos_id)
    pad, kw = policy.tokenizer.pad_token_id, {"batching": cfg.batching, "pack_length": cfg.pack_length}

    def column(budget: int) -> list[float | None]:
        def scorer(prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
            return score(policy.model, prompts, responses, pad, budget, "rescore ppl-delta", **kw)

        return ppl_delta_rewards(rows, refs, scorer)

    return column
