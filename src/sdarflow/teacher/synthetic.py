"""The synthetic teacher (``rescore --teacher-context synthetic``): the machinery's positive control, a teacher that
is better than the student by construction and reads nothing.

On every token of a turn whose action equals the env's expert action, the teacher is the student with the sampled
token's logit raised by ``delta``; on every other turn's tokens, lowered by ``delta``. ``label_noise`` p flips each
turn's label with probability p: at p = 0.5 the teacher keeps the statistics of its log-probs and loses their
content, so SDAR with p = 0 against p = 0.5 tells whether the distillation path carries what a teacher knows.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from sdarflow.errors import ConfigError


def tilted_logprobs(logprobs: Tensor, shift: Tensor) -> Tensor:
    """Log-probability of the sampled token after adding ``shift`` to its logit alone (every other logit kept).

    With ``s`` the token's log-probability (``p = exp(s)``) and ``d`` the shift:
        ``log q = s + d - log(exp(s + d) + 1 - exp(s))``,
    the softmax renormalised over the raised token and the unchanged rest, so ``q`` is a probability (``log q <= 0``:
    adding ``d`` to a log-probability would not be one, and the data contract refuses log-probs above 0). ``q > p``
    for ``d > 0``, ``q < p`` for ``d < 0``; a certain token (``s = 0``) stays certain. Shapes broadcast; no gradient
    is needed (the teacher is a constant).
    """
    s = logprobs.to(torch.float64)
    raised = s + shift.to(torch.float64)
    rest = torch.log1p(-torch.exp(s).clamp(max=1.0))  # log(1 - p): -inf for a certain token
    return (raised - torch.logaddexp(raised, rest)).to(logprobs.dtype)


def synthetic_teacher(
    old: list[list[float]], expert_match: list[bool | None], delta: float, label_noise: float, seed: int | str
) -> tuple[list[list[float]], list[bool]]:
    """Teacher log-probs for each row (a turn) from its student log-probs ``old`` and whether its action matched the
    expert's, each label flipped with probability ``label_noise`` (``seed``: the flips); and the labels used.
    ConfigError (one line) when a row has no expert label."""
    missing = sum(m is None for m in expert_match)
    if missing:
        raise ConfigError(
            f"rescore --teacher-context synthetic: {missing} of {len(expert_match)} turns have no expert label "
            f"(expert_match is null: the env has no expert_action()); fix: generate on an env with an expert "
            f"(textworld-cooking, tool-use, search-qa), or use --teacher-context skills"
        )
    rng = random.Random(seed)
    labels = [bool(m) != (rng.random() < label_noise) for m in expert_match]
    teacher = [
        tilted_logprobs(
            torch.tensor(o, dtype=torch.float64), torch.tensor(delta if label else -delta)
        ).tolist()
        for o, label in zip(old, labels, strict=True)
    ]
    return teacher, labels
