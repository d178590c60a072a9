"""The progress advantage (``train --advantage progress``): ``A_t + coef * (old_t - ref_t)`` on every response token,
how far training has already moved each token from the base model, as a step-level term inside a turn
(:func:`progress_advantages`; needs rescored ``ref_logprobs``)."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor


def progress_term(cfg):
    """The token-advantage term of :data:`sdarflow.train.samples.TOKEN_ADVANTAGES` at ``--progress-coef``."""
    return partial(progress_advantages, coef=cfg.progress_coef)


def progress_advantages(
    advantages: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, coef: float
) -> Tensor:
    """Outcome advantage plus the progress term: ``A'_t = A_t + coef * (log pi(y_t) - log pi_ref(y_t))``.

    The log-ratio to the reference policy (the base model) says how far training has already moved each token;
    as a step-level term it separates the tokens of one turn that GRPO weighs alike. It is the negative of a
    KL-in-reward penalty (it rewards moving away from the reference, against a KL loss) and 0 while the policy is
    the reference (round 0). All (B, T); the log-probs are constants (sdarflow passes the rescored ones of the
    policy that generated the rows); 0 on masked tokens (``where``: padded log-probs may be -inf).
    """
    a = advantages.detach() + coef * (logprobs.detach() - ref_logprobs.detach())
    return torch.where(mask.bool(), a, torch.zeros_like(a))
