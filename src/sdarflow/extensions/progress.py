"""The progress advantage (``train --advantage progress``): ``A_t + coef * (old_t - ref_t)`` on every response token,
how far training has already moved each token from the base model, as a step-level term inside a turn
(:func:`sdarflow.algo.progress_advantages`; needs rescored ``ref_logprobs``)."""

from __future__ import annotations

from functools import partial

from sdarflow.algo import progress_advantages


def progress_term(cfg):
    """The token-advantage term of :data:`sdarflow.train.samples.TOKEN_ADVANTAGES` at ``--progress-coef``."""
    return partial(progress_advantages, coef=cfg.progress_coef)
