"""The RL update on the tiny model: every method moves the LoRA weights; non-finite steps are skipped, then fail;
micro-batching never changes the gradient; SFT steps interleave at the ratio."""

from __future__ import annotations

import math

import pytest
import torch
from factories import two_episodes

from sdarflow.algo import METHODS
from sdarflow.errors import ConfigError
from sdarflow.models import load_policy
from sdarflow.models.forward import make_batch, response_logprobs
from sdarflow.models.policy import new_lora
from sdarflow.train.engine import TorchEngine
from sdarflow.train.samples import TOKEN_ADVANTAGES, advantage_stats, make_samples, row_advantages
from sdarflow.train.schedule import WarmupConstant
from sdarflow.train.sft import sft_pairs_from_rows
from sdarflow.train.trainer import (
    REQUIRED_METRICS,
    TrainData,
    TrainingDiverged,
    TrainLoop,
    accumulate,
    micro_step,
    train,
    window_kl,
)


def rl_update(model, opt, samples, hp, pad, sft_pairs=None) -> list[dict]:
    """One round through the trainer at the optimizer's constant learning rate; its per-step metrics."""
    engine = TorchEngine(model, opt, hp.max_grad_norm)
    data = TrainData(samples, sft_pairs or [], pad)
    return train(engine, data, hp, WarmupConstant(opt.param_groups[0]["lr"])).history


def rescored_rows(n_groups: int = 2, g: int = 2, nan: bool = False) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for grp in range(n_groups):
        for i in range(g):
            resp = torch.randint(5, 300, (3,), generator=gen).tolist()
            old = (-torch.rand(3, generator=gen) * 3).tolist()
            rows.append(
                {
                    "traj_id": f"g{grp}/e{i}",
                    "group_id": f"g{grp}",
                    "episode_return": float(i % 2),
                    "format_ok": True,
                    "prompt_token_ids": torch.randint(5, 300, (10,), generator=gen).tolist(),
                    "response_token_ids": resp,
                    "old_logprobs": [float("nan")] * 3 if nan else old,
                    "teacher_logprobs": [x + 0.5 for x in old],
                    "ref_logprobs": [x - 0.2 for x in old],
                }
            )
    return rows


def lora_model(tiny_model):
    policy = load_policy(str(tiny_model), trainable=True)
    torch.manual_seed(0)
    model = new_lora(policy.model, 4, 8, ["q_proj", "v_proj"])
    return model, policy.tokenizer.pad_token_id


def test_row_advantages_by_hand():
    # group a: a 3-turn success whose 2nd action did not parse, a 1-turn failure; group b: one 2-turn episode
    rows = [
        {"group_id": "a", "traj_id": "a/0", "episode_return": 1.0, "format_ok": True},
        {"group_id": "a", "traj_id": "a/0", "episode_return": 1.0, "format_ok": False},
        {"group_id": "a", "traj_id": "a/0", "episode_return": 1.0, "format_ok": True},
        {"group_id": "a", "traj_id": "a/1", "episode_return": 0.0, "format_ok": False},
        {"group_id": "b", "traj_id": "b/0", "episode_return": 0.5, "format_ok": True},
        {"group_id": "b", "traj_id": "b/0", "episode_return": 0.5, "format_ok": True},
    ]
    # scores with penalty 0.1: a = [1, 0.9, 1, -0.1], b = [0.5, 0.5]
    a = [1.0, 0.9, 1.0, -0.1]
    mean_a = sum(a) / 4  # 0.7
    std_a = (sum((x - mean_a) ** 2 for x in a) / 3) ** 0.5
    expected = [(x - mean_a) / (std_a + 1e-6) for x in a] + [0.0, 0.0]  # b: identical scores -> 0
    assert row_advantages(rows, penalty=0.1) == pytest.approx(expected, rel=1e-5)
    # per episode: a/0 scores its rows' mean 2.9 / 3, a/1 -0.1, each row its episode's; b: one episode, mean 0, std 1
    e0, e1 = 2.9 / 3, -0.1
    mean_e, std_e = (e0 + e1) / 2, abs(e0 - e1) / 2**0.5
    per_episode = (
        [(e0 - mean_e) / (std_e + 1e-6)] * 3 + [(e1 - mean_e) / (std_e + 1e-6)] + [0.5 / (1 + 1e-6)] * 2
    )
    assert row_advantages(rows, penalty=0.1, per_episode=True) == pytest.approx(per_episode, rel=1e-5)
    # equal episode weight: a/0 has 2 + 3 + 1 = 6 response tokens, a/1 has 2; group a's mean episode length is 4
    for r, n in zip(rows, (2, 3, 1, 2, 1, 1), strict=True):
        r["response_token_ids"] = list(range(n))
    scale = [4 / 6] * 3 + [4 / 2] + [1.0, 1.0]
    equal = row_advantages(rows, penalty=0.1, episode_weight="equal")
    assert equal == pytest.approx([x * c for x, c in zip(expected, scale, strict=True)], rel=1e-5)


def test_advantage_stats_token_weighted_mean_by_hand():
    # a success (A = +1) of 2 tokens and a failure (A = -1) of 6: (2 - 6) / 8
    rows = [{"group_id": "a", "response_token_ids": [0] * n} for n in (2, 3, 3)]
    assert advantage_stats(rows, [1.0, -1.0, -1.0])["adv/token_weighted_mean"] == pytest.approx(-0.5)


def test_advantage_stats_by_hand():
    rows = [{"group_id": g, "response_token_ids": [0]} for g in ("a", "a", "b", "b", "c")]
    stats = advantage_stats(rows, [1.0, -1.0, 0.0, 0.0, 0.0])
    # b (both 0) and c (a group of one that scored 0) give no gradient: 2 of 3 groups
    assert stats["adv/zero_group_share"] == pytest.approx(2 / 3)
    assert stats["adv/abs_mean"] == pytest.approx(0.4)
    assert stats["adv/std"] == pytest.approx((2 / 4) ** 0.5)  # unbiased: sum of squares 2 - 5 * 0 over 4


def test_advantages_are_group_normalized():
    samples = make_samples(rescored_rows())
    by_group: dict[str, float] = {}
    for row, s in zip(rescored_rows(), samples):
        by_group[row["group_id"]] = by_group.get(row["group_id"], 0.0) + s.advantage
    assert all(abs(v) < 1e-5 for v in by_group.values())


@pytest.mark.parametrize("method", METHODS)
def test_every_method_moves_the_adapter(tiny_model, method):
    model, pad = lora_model(tiny_model)
    # lora_B starts at zero, so the A side shows movement after one step
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    history = rl_update(
        model,
        opt,
        make_samples(rescored_rows()),
        TrainLoop(method=method, mini_batches=2, sdar_coef=0.5),
        pad,
    )
    assert len(history) == 2 and not any(h["skipped"] for h in history)
    moved = sum(
        float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters() if p.requires_grad
    )
    assert moved > 0
    # every method's line carries every required metric, with a value (the teacher-gap diagnostics included)
    assert all(history[0][k] is not None for k in REQUIRED_METRICS)


def test_weight_decay_is_adamws_decoupled_decay(tiny_model):
    """--weight-decay wd: p <- p - lr * wd * p besides Adam's step; with a zero gradient Adam's step is 0, so every
    trained weight is scaled by exactly 1 - lr * wd (0.95 here), and the frozen base is untouched."""
    from sdarflow.train.engine import make_engine

    model = new_lora(load_policy(str(tiny_model), trainable=True).model, 4, 8, ["q_proj"])
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = make_engine("torch", model, lr=0.1, max_grad_norm=0.0, weight_decay=0.5)
    for p in trained.values():
        p.grad = torch.zeros_like(p)
    assert engine.step(0.1).applied
    for name, p in model.named_parameters():
        expected = before[name] * 0.95 if name in trained else before[name]
        assert torch.allclose(p.detach(), expected, rtol=0, atol=1e-7), name


def test_non_finite_steps_are_skipped_then_fail(tiny_model):
    model, pad = lora_model(tiny_model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    samples = make_samples(rescored_rows(nan=True))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with pytest.raises(TrainingDiverged, match="3 consecutive non-finite steps"):
        rl_update(
            model,
            opt,
            samples,
            TrainLoop(method="grpo", mini_batches=1, epochs=5, max_nonfinite_steps=3),
            pad,
        )
    # skipped means skipped: no weight change and no optimizer state (AdamW would move even on a zero gradient)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad)
    assert not opt.state


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_splitting_a_mini_batch_never_changes_its_gradient(tiny_model, agg):
    model, pad = lora_model(tiny_model)
    # lora_B is zero at init, so lora_A would get no gradient; make both sides live
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    hp = TrainLoop(method="sdar", sdar_coef=0.5, agg=agg, kl_coef=0.1, entropy_coef=0.01)
    rows = rescored_rows(n_groups=3, g=2)
    for i, r in enumerate(rows):  # uneven lengths, so token and sequence weights differ
        for key in ("response_token_ids", "old_logprobs", "teacher_logprobs", "ref_logprobs"):
            r[key] = r[key][: 1 + i % 3]
    samples = make_samples(rows)
    engine = TorchEngine(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]), 1.0)
    grads = []
    for budget in (10_000, 1):  # one micro-batch, then one per sample

        def loss_fn(micro):
            return micro_step(model, micro, hp, TrainData([], [], pad))

        metrics, _ = accumulate(engine, samples, loss_fn, agg, budget)
        grads.append((_grads(model), metrics["loss/total"]))
        engine.zero_grad()
    (g_one, loss_one), (g_split, loss_split) = grads
    if agg != "seq-mean-token-sum-norm":  # its metrics are averaged per sequence, not summed like its loss
        assert abs(loss_one - loss_split) < 1e-5
    scale = max(float(g.abs().max()) for g in g_one.values())
    assert scale > 0
    # float32 sums in another order differ by a few ulps (seen: 9e-7 of the largest gradient); a wrong
    # micro-batch weight is off by a whole fraction of it
    assert max(float((g_one[n] - g_split[n]).abs().max()) for n in g_one) < 1e-5 * scale


def test_sft_steps_interleave_and_every_line_has_the_required_metrics(tiny_model):
    model, pad = lora_model(tiny_model)
    rows = rescored_rows()
    for r in rows:
        r["success"] = r["episode_return"] > 0
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    hp = TrainLoop(method="sdar", mini_batches=2, epochs=2, sft_ratio=0.5)
    history = rl_update(model, opt, make_samples(rows), hp, pad, sft_pairs=sft_pairs_from_rows(rows))
    assert [h["kind"] for h in history] == ["rl", "rl", "sft", "rl", "rl", "sft"]
    for h in history:
        assert set(REQUIRED_METRICS) | {"step", "grad_norm", "lr", "tokens_per_s"} <= h.keys()
    sft = history[2]
    assert sft["loss/sft"] == sft["loss/total"] > 0 and sft["sdar/gate_mean"] is None
    assert history[0]["sdar/gate_mean"] is not None and history[0]["loss/aux"] is not None


def test_entropy_bonus_and_kl_terms_in_the_trainer(tiny_model):
    model, pad = lora_model(tiny_model)
    rows = rescored_rows()
    for r in rows:  # every group solved alike: all advantages are 0, so only the bonus and the KL train
        r["episode_return"] = 1.0
    samples = make_samples(rows)
    assert all(s.advantage == 0 for s in samples)
    batch = make_batch([s.prompt for s in samples], [s.response for s in samples], pad)
    with torch.no_grad():
        logp, ent = response_logprobs(model, batch, with_entropy=True)
    entropy = float((ent * batch.mask).sum() / batch.mask.sum())
    plain, _ = micro_step(model, samples, TrainLoop(method="grpo", entropy_coef=0.0), TrainData([], [], pad))
    bonus, m = micro_step(model, samples, TrainLoop(method="grpo", entropy_coef=0.01), TrainData([], [], pad))
    assert bonus.item() == pytest.approx(plain.item() - 0.01 * entropy, rel=1e-5, abs=1e-7)
    assert m["actor/entropy"] == pytest.approx(entropy, rel=1e-5)
    # a reference 0.3 nats off the model on every token: k3 = e^0.3 - 0.3 - 1 (and e^-0.3 + 0.3 - 1)
    width = logp.shape[1]
    for i, s in enumerate(samples):
        sign = 1 if i % 2 else -1
        s.ref_logprobs = (logp[i, width - len(s.response) :] + sign * 0.3).tolist()
    k3 = [math.exp(0.3) - 0.3 - 1, math.exp(-0.3) + 0.3 - 1]
    n = [sum(len(s.response) for i, s in enumerate(samples) if i % 2 == j) for j in (1, 0)]
    expected = (n[0] * k3[0] + n[1] * k3[1]) / sum(n)
    with_kl, m = micro_step(
        model, samples, TrainLoop(method="grpo", entropy_coef=0.0, kl_coef=0.1), TrainData([], [], pad)
    )
    assert m["actor/kl_loss"] == pytest.approx(expected, rel=1e-4)
    assert with_kl.item() == pytest.approx(plain.item() + 0.1 * expected, rel=1e-4)
    # with zero advantages the bonus is the whole gradient: -0.01 * d(mean entropy), so descent raises entropy
    bonus.backward()
    got = _grads(model)
    model.zero_grad()
    _, ent = response_logprobs(model, batch, with_entropy=True)
    ((ent * batch.mask).sum() / batch.mask.sum()).backward()
    want = {n: -0.01 * g for n, g in _grads(model).items()}
    assert max(float(want[n].abs().max()) for n in want) > 0
    assert max(float((got[n] - want[n]).abs().max()) for n in got) < 1e-7


def test_progress_term_adds_coef_times_the_log_ratio_to_every_tokens_advantage(tiny_model):
    from sdarflow.stages.train import TrainConfig

    model, pad = lora_model(tiny_model)
    samples = make_samples(rescored_rows())
    batch = make_batch([s.prompt for s in samples], [s.response for s in samples], pad)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, with_entropy=True)
    width = logp.shape[1]
    for i, s in enumerate(samples):  # old = the model's own log-probs + 0.01: ratio e^-0.01, inside the clip
        s.old_logprobs = [x + 0.01 for x in logp[i, width - len(s.response) :].tolist()]
        s.ref_logprobs = [x - 0.2 - 0.1 * (i % 2) for x in s.old_logprobs]  # old - ref = 0.2 or 0.3
    hp = TrainLoop(method="grpo", entropy_coef=0.0)
    _, plain = micro_step(model, samples, hp, TrainData([], [], pad))
    progress = TOKEN_ADVANTAGES.get("progress")(TrainConfig(advantage="progress", progress_coef=0.5))
    _, shaped = micro_step(model, samples, hp, TrainData([], [], pad, token_advantages=progress))
    # grpo inside the clip: loss/pg = -token-mean(A * ratio); the term adds 0.5 * (old - ref), 0.2 or 0.3, to A on
    # each token (with the current log-probs in place of old it would add 0.19 or 0.29)
    n = [sum(len(s.response) for i, s in enumerate(samples) if i % 2 == j) for j in (0, 1)]
    bonus = 0.5 * (0.2 * n[0] + 0.3 * n[1]) / sum(n) * math.exp(-0.01)
    assert shaped["loss/pg"] == pytest.approx(plain["loss/pg"] - bonus, rel=1e-4, abs=1e-6)
    assert "actor/kl_loss" not in shaped  # the reference feeds the term, not a KL loss (kl_coef 0)


def _shaping(rows, **settings):
    from sdarflow.stages.train import TrainConfig
    from sdarflow.train.rl_setup import rl_shaping

    return rl_shaping(TrainConfig(invalid_action_penalty=0.0, format_guard="off", **settings), rows)


def test_the_stage_settings_reach_the_advantages():
    a = 0.5 / (3**-0.5 + 1e-6)
    rows = [{**r, "ppl_delta": None, "env": "test"} for r in two_episodes()]
    assert _shaping(rows).advantages == pytest.approx([a, a, -a, -a], rel=1e-6)
    assert _shaping(rows, credit="scpo").advantages == pytest.approx([a, a, a, -a], rel=1e-6)
    rows[3]["prompt_token_ids"] = [1, 2, 7, 4]
    assert _shaping(rows, filter="negative-value").dropped == [False, False, False, True]
    # the turn reward: every ppl_delta null is a run rescored without --ppl-delta
    with pytest.raises(
        ConfigError, match="needs the rescored ppl_delta column.*fix: rescore with --ppl-delta"
    ):
        _shaping(rows, reward="perplexity-delta")
    rows[2]["ppl_delta"] = 2.0  # F's first turn made the answer likelier: scores 1, 1, 2, 0
    shaped = _shaping(rows, reward="perplexity-delta", reward_coef=0.5).advantages  # 1, 1, 1, 0
    b = 0.25 / ((3 * 0.25**2 + 0.75**2) / 3) ** 0.5
    assert shaped == pytest.approx([b, b, b, -3 * b], rel=1e-5)


def test_each_rl_step_records_the_aux_terms_gradient_share(tiny_model):
    """sdar's share is |grad(lambda * L_SDAR)| / |grad L_pg| on the step's first micro-batch: linear in lambda at
    the same weights (lr 0 keeps them), absent (None) for grpo, which has no auxiliary term."""

    def first_step(method: str, coef: float) -> dict:
        torch.manual_seed(0)
        model, pad = lora_model(tiny_model)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
        hp = TrainLoop(method=method, mini_batches=1, sdar_coef=coef, kl_coef=0.0)
        return rl_update(model, opt, make_samples(rescored_rows()), hp, pad)[0]

    small, large = first_step("sdar", 0.01), first_step("sdar", 0.04)
    assert 0 < small["grad/aux_share"] and math.isfinite(small["grad/aux_share"])
    assert large["grad/aux_share"] == pytest.approx(4 * small["grad/aux_share"], rel=1e-4)
    assert large["grad/pg_norm"] == pytest.approx(small["grad/pg_norm"], rel=1e-5)
    grpo = first_step("grpo", 0.01)
    assert grpo["grad/aux_share"] is None and grpo["grad/pg_norm"] > 0


def _on_policy(model, rows: list[dict], pad: int) -> list[dict]:
    """``rows`` with the model's own log-probs as old_logprobs (as rescore records them for the next update)."""
    with torch.no_grad():
        batch = make_batch(
            [r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows], pad
        )
        current = response_logprobs(model, batch)[0]
    return [
        {**r, "old_logprobs": lp[-len(r["response_token_ids"]) :].tolist()}
        for r, lp in zip(rows, current, strict=True)
    ]


@pytest.mark.parametrize("target_kl", [1e-4, 0.0])
def test_target_kl_stops_before_the_step_that_measures_a_kl_above_it(tiny_model, target_kl):
    """--target-kl: the first step (on-policy: KL 0) is applied; the second measures the KL its predecessor made,
    above 1e-4 at lr 0.05, so the run stops there without applying it: the weights are exactly a one-step run's.
    0 runs every step."""

    def run(hp):
        model, pad = lora_model(tiny_model)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
        samples = make_samples(_on_policy(model, rescored_rows(), pad))
        state = train(TorchEngine(model, opt, 1.0), TrainData(samples, [], pad), hp, WarmupConstant(0.05))
        return state, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    state, weights = run(TrainLoop(method="grpo", mini_batches=1, epochs=4, kl_coef=0.0, target_kl=target_kl))
    if not target_kl:
        assert state.step == 4 and state.kl_stop is None
        return
    assert state.step == 1 and len(state.history) == 1
    assert state.history[0]["actor/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert state.kl_stop["step"] == 2 and state.kl_stop["approx_kl"] > target_kl
    _, one_step = run(TrainLoop(method="grpo", mini_batches=1, max_steps=1, kl_coef=0.0))
    assert all(torch.equal(weights[n], one_step[n]) for n in weights)


def test_window_kl_is_the_mean_over_this_and_the_last_applied_rl_steps():
    """Hand-computed: the applied RL steps' KLs are 0.1, 0.5, 0.2 (the SFT step and the skipped step are not
    RL steps that moved the policy); this step measures 0.3."""
    history = [
        {"kind": "rl", "skipped": False, "actor/approx_kl": 0.1},
        {"kind": "sft", "skipped": False, "actor/approx_kl": None},
        {"kind": "rl", "skipped": False, "actor/approx_kl": 0.5},
        {"kind": "rl", "skipped": True, "actor/approx_kl": math.nan},
        {"kind": "rl", "skipped": False, "actor/approx_kl": 0.2},
    ]
    assert window_kl(history, 0.3, 1) == pytest.approx(0.3)
    assert window_kl(history, 0.3, 3) == pytest.approx((0.5 + 0.2 + 0.3) / 3)
    assert window_kl(history, 0.3, 10) == pytest.approx((0.1 + 0.5 + 0.2 + 0.3) / 4)
    assert window_kl([], 0.3, 8) == pytest.approx(0.3)


def test_target_kl_window_lets_one_high_mini_batch_through_when_the_mean_is_below(tiny_model):
    """The step a per-mini-batch target stops before (KL k2 after one on-policy step at KL 0) is applied under a
    target of 0.75 k2 with a window of 2 (mean k2 / 2); if that run stops later, the KL it records is above the
    target."""
    model, pad = lora_model(tiny_model)
    samples = make_samples(_on_policy(model, rescored_rows(), pad))

    def run(hp):
        model, _ = lora_model(tiny_model)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
        return train(TorchEngine(model, opt, 1.0), TrainData(samples, [], pad), hp, WarmupConstant(0.05))

    base = dict(method="grpo", mini_batches=1, epochs=4, kl_coef=0.0)
    alone = run(TrainLoop(**base, target_kl=1e-4))
    k2 = alone.kl_stop["approx_kl"]
    assert alone.step == 1 and k2 > 1e-4
    windowed = run(TrainLoop(**base, target_kl=0.75 * k2, target_kl_window=2))
    assert windowed.step >= 2
    assert windowed.history[1]["actor/approx_kl"] == pytest.approx(k2, rel=1e-4)
    assert windowed.step == 4 or windowed.kl_stop["approx_kl"] > 0.75 * k2


def test_grpo_overfits_a_fixed_set_round_after_round(tiny_model):
    """The overfit direction at smoke size: GRPO rounds on the same groups (each round re-scored on-policy, as
    rescore does) widen every group's margin of its rewarded response over its unrewarded one, round after round."""
    model, pad = lora_model(tiny_model)
    rows = rescored_rows(
        n_groups=3, g=2
    )  # per group: episode 0 failed (return 0), episode 1 solved (return 1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)

    def logprobs() -> list[float]:
        with torch.no_grad():
            batch = make_batch(
                [r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows], pad
            )
            return response_logprobs(model, batch)[0].sum(dim=1).tolist()

    def margins() -> list[float]:  # per group: log p(solved response) - log p(failed response)
        lp = logprobs()
        return [lp[i + 1] - lp[i] for i in range(0, len(rows), 2)]

    history = [margins()]
    for _ in range(3):
        rows = _on_policy(model, rows, pad)  # as the next round's rescore
        rl_update(model, opt, make_samples(rows), TrainLoop(method="grpo", mini_batches=2, kl_coef=0.0), pad)
        history.append(margins())
    for group in zip(*history, strict=True):
        assert all(b > a for a, b in zip(group, group[1:])), history
    assert sum(history[-1]) - sum(history[0]) > 0.3, history
