"""The learned state value of the negative-value filter (``--value-estimate head``), FORCE-style: a linear head on
the policy's hidden state at a turn's prompt, fitted each round to the turns' Monte-Carlo returns and carried in
the adapter (``value_head.pt``), so it keeps what earlier rounds taught it (:func:`fit_value_head`).

The group estimate (``--value-estimate group``, the default) needs no model: it compares the rollouts of one group
that reached the same state. The head generalizes across tasks and rounds, but must be fitted first: during the
first ``--value-warmup-rounds`` rounds it is all that trains; the policy is not updated, and the round publishes
its input adapter's weights (a new LoRA: the base model's behaviour) with the head.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from sdarflow.errors import ModelError
from sdarflow.train.rl_setup import reward_coef, rl_step_of
from sdarflow.train.samples import row_scores

log = logging.getLogger(__name__)

ESTIMATES = ("group", "head")
VALUE_FILE = "value_head.pt"
L2 = 1e-2  # ridge weight towards the previous round's head (features are unit vectors)

States = Callable[[list[list[int]]], torch.Tensor]  # prompts -> (N, H) hidden states


@dataclass
class ValueHead:
    weights: torch.Tensor | None = None  # (H + 1,) float64: None until a round fits it
    rounds: int = 0  # rounds it was fitted on

    @classmethod
    def load(cls, adapter_dir: str | None) -> ValueHead:
        """The head the input adapter carries; a new one without an adapter or when it has none."""
        path = Path(adapter_dir) / VALUE_FILE if adapter_dir else None
        if path is None or not path.is_file():
            return cls()
        saved = torch.load(path, weights_only=True)
        return cls(saved["weights"], int(saved["rounds"]))

    def save(self, folder: Path) -> None:
        torch.save({"weights": self.weights, "rounds": self.rounds}, folder / VALUE_FILE)

    def fit(self, features: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Refit on this round's (unit-normalized) states and returns; (each state's value after the fit, metrics).

        ``value/prior_mse`` is the previous head's error on these states before the fit (an out-of-sample error:
        it never saw this round), ``value/mse`` the fitted head's."""
        x = torch.nn.functional.normalize(features.double(), dim=-1)
        if self.weights is not None and self.weights.shape[0] != x.shape[1] + 1:
            raise ModelError(
                f"train --value-estimate head: the adapter's {VALUE_FILE} takes {self.weights.shape[0] - 1} "
                f"features, but the model's hidden size is {x.shape[1]}; fix: start the lineage again (no "
                f"--adapter), or pass --value-estimate group"
            )
        y = targets.double()
        variance = float(y.var(unbiased=False)) if y.numel() else 0.0
        metrics = {"value/target_var": variance}
        if self.weights is not None:
            metrics["value/prior_mse"] = float(((head_values(x, self.weights) - y) ** 2).mean())
        self.weights = fit_value_head(x, y, self.weights, L2)
        self.rounds += 1
        values = head_values(x, self.weights)
        metrics["value/mse"] = float(((values - y) ** 2).mean())
        metrics["value/rounds"] = float(self.rounds)
        return values, metrics


def fit_round(
    head: ValueHead, states: States, cfg, rows: list[dict]
) -> tuple[torch.Tensor, dict[str, float], bool]:
    """The head refitted on the round's states and GRPO scores (cfg resolved): (each row's state value, the fit's
    metrics, whether this round is one of the first ``--value-warmup-rounds``, where only the head trains)."""
    features = states([r["prompt_token_ids"] for r in rows])
    values, metrics = head.fit(features, row_scores(rows, cfg.invalid_action_penalty, reward_coef(cfg, rows)))
    rl_step = rl_step_of(rows)
    warm = rl_step <= cfg.value_warmup_rounds
    if warm:
        log.info(
            "train: value warm-up round %d of %d: only the value head is fitted, the policy is not updated",
            rl_step,
            cfg.value_warmup_rounds,
        )
    return values, metrics, warm


def policy_states(engine, pad_id: int, max_tokens: int) -> States:
    """States from the engine's policy as it generated the rows (dropout off), for :meth:`ValueHead.fit`."""
    from sdarflow.models.forward import prompt_states

    def states(prompts: list[list[int]]) -> torch.Tensor:
        # a group's episodes share their first prompts: each distinct prompt runs once
        distinct = list(dict.fromkeys(tuple(p) for p in prompts))
        was_training = engine.model.training
        engine.model.eval()
        try:
            found = prompt_states(
                engine.forward_model, [list(p) for p in distinct], pad_id, max_tokens, engine.device
            )
        finally:
            engine.model.train(was_training)
        index = {p: i for i, p in enumerate(distinct)}
        return found[[index[tuple(p)] for p in prompts]]

    return states


def fit_value_head(
    features: Tensor, targets: Tensor, prior: Tensor | None = None, l2: float = 1e-2
) -> Tensor:
    """A linear value head ``V(s) = [x_s, 1] . w`` fitted to Monte-Carlo returns by ridge regression anchored at
    the previous head, so a warm-up's rounds accumulate what they saw (FORCE-style):

        w* = argmin_w (1/n) sum_i ([x_i, 1] . w - y_i)^2 + l2 * ||w - w0||^2
           = (X^T X / n + l2 I)^-1 (X^T y / n + l2 w0),    X = [features, 1],  w0 = prior (0 when None)

    Solved in float64. ``features`` (N, H), ``targets`` (N,), ``prior`` (H + 1,) -> ``w`` (H + 1,), no gradient.
    """
    if l2 <= 0:
        raise ValueError(f"l2 must be > 0 (it makes the system solvable for any N), got {l2}")
    x = torch.cat([features.detach().double(), features.new_ones(features.shape[0], 1).double()], dim=1)
    y = targets.detach().double()
    n, d = x.shape
    w0 = torch.zeros(d, dtype=torch.float64) if prior is None else prior.detach().double()
    if w0.shape != (d,):
        raise ValueError(f"prior must be (H + 1,) = ({d},) for features (N, {d - 1}), got {tuple(w0.shape)}")
    lhs = x.T @ x / max(n, 1) + l2 * torch.eye(d, dtype=torch.float64)
    return torch.linalg.solve(lhs, x.T @ y / max(n, 1) + l2 * w0)


def head_values(features: Tensor, weights: Tensor) -> Tensor:
    """The head's value of each state, ``[x_i, 1] . w``: (N, H), (H + 1,) -> (N,) float64."""
    return features.detach().double() @ weights[:-1].double() + weights[-1].double()
