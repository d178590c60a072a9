"""Pure tensor functions of SDAR and the GRPO/OPSD family: advantages, losses, gates, aggregation, log-probs.

No I/O. The one config object is :class:`Objective`, the loss's settings; training code passes it with the tensors
to :func:`method_loss`, which selects the method by name (names in :data:`METHODS`) and aggregates with one of
:data:`AGG_MODES`. Importing this package registers every method.
"""

from sdarflow.algo.advantages import (
    broadcast_advantages,
    episode_length_scale,
    grpo_advantages,
    penalized_scores,
    rlsd_advantages,
    rlsd_lambda,
    rlsd_weights,
)
from sdarflow.algo.agg import AGG_MODES, agg_loss, masked_mean, masked_mean_value
from sdarflow.algo.logprobs import (
    entropy_from_logits,
    linear_entropy,
    linear_token_logprobs,
    token_logprobs,
    turn_progress,
)
from sdarflow.algo.losses import (
    kl_penalty,
    ppo_clip_loss,
    sdar_gate,
    sdar_loss,
    skill_sd_loss,
)
from sdarflow.algo.objective import (
    METHOD_REGISTRY,
    METHODS,
    Objective,
    aux_grad_share,
    method_loss,
    method_terms,
    register_method,
)
from sdarflow.names import UnknownNameError
