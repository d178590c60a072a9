"""The method registry: every method trains, composes its terms as documented, and fails clearly."""

import math

import pytest
import torch

from sdarflow.algo import (
    METHOD_REGISTRY,
    METHODS,
    Objective,
    UnknownNameError,
    aux_grad_share,
    method_loss,
    method_terms,
    register_method,
    token_logprobs,
)

B, T = 4, 6


def _call(
    method, *, logprobs, old_logprobs, teacher_logprobs, advantages, mask, ref_logprobs=None, step=1, **cfg
):
    """method_loss with the tensors as keywords and the objective's settings beside them."""
    objective = Objective(method=method, **cfg)
    return method_loss(
        logprobs,
        old_logprobs,
        teacher_logprobs,
        advantages,
        mask,
        objective,
        ref_logprobs=ref_logprobs,
        step=step,
    )


def _batch(seed: int = 0, **overrides):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[:, 0] = True
    logprobs = (-torch.rand(B, T, generator=g) * 2).requires_grad_()
    batch = {
        "logprobs": logprobs,
        "old_logprobs": (logprobs + 0.05 * torch.randn(B, T, generator=g)).detach(),
        "teacher_logprobs": -torch.rand(B, T, generator=g) * 2,
        "advantages": torch.randn(B, 1, generator=g).expand(B, T) * mask,
        "mask": mask,
    }
    return batch | overrides


def test_methods_are_the_six_named():
    assert set(METHODS) == {"grpo", "opsd", "grpo_opsd", "rlsd", "skill_sd", "sdar"}
    assert METHOD_REGISTRY.names() == METHODS


@pytest.mark.parametrize("method", METHODS)
def test_every_method_gives_a_finite_scalar_with_gradient(method):
    batch = _batch()
    loss, metrics = _call(method, **batch)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grad = batch["logprobs"].grad
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert grad[~batch["mask"]].eq(0).all()
    assert metrics["loss/total"] == pytest.approx(loss.item())
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert all("/" in k for k in metrics)


@pytest.mark.parametrize(
    ("method", "has_pg", "has_aux"),
    [
        ("grpo", True, False),
        ("opsd", False, True),
        ("grpo_opsd", True, True),
        ("rlsd", True, False),
        ("skill_sd", True, True),
        ("sdar", True, True),
    ],
)
def test_metric_terms_and_total(method, has_pg, has_aux):
    _, m = _call(method, sdar_coef=0.3, skill_sd_coef=0.2, **_batch())
    assert ("loss/pg" in m) == has_pg
    assert ("loss/aux" in m) == has_aux
    expected = m.get("loss/pg", 0.0) + m.get("loss/aux_coef", 0.0) * m.get("loss/aux", 0.0)
    assert m["loss/total"] == pytest.approx(expected, rel=1e-6)
    if has_aux:
        assert m["loss/aux_coef"] == (0.2 if method == "skill_sd" else 0.3)


# --- every method against values computed by hand (plain floats, the reference's formulas) -----------------------
# One row of three response tokens and a masked fourth; the student is the current policy.
S = [-1.0, -0.4, -2.0, -9.0]  # logprobs
OLD = [-1.2, -0.4, -0.6, -9.0]  # rollout-time log-probs
Q = [-0.5, -1.4, -1.0, -9.0]  # teacher
REF = [-1.5, -0.2, -2.0, -9.0]  # reference policy
MASK4 = [1, 1, 1, 0]


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _mean(values: list[float]) -> float:
    kept = [v for v, m in zip(values, MASK4) if m]
    return sum(kept) / len(kept)


def _ppo(adv: list[float], c: float = 3.0) -> float:
    out = []
    for s, o, a in zip(S, OLD, adv):
        r = math.exp(s - o)
        l1 = max(-a * r, -a * min(max(r, 0.8), 1.2))
        out.append(min(l1, -a * c) if a < 0 else l1)
    return _mean(out)


def _gated(beta: float) -> float:
    return _mean([_sig(beta * (q - s)) * (q - s) for s, q in zip(S, Q)])


def _k3_kl() -> float:
    return _mean([math.exp(r - s) - (r - s) - 1 for s, r in zip(S, REF)])


def _loss(method: str, adv: float, **kw):
    t = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    return _call(
        method,
        logprobs=t(S).requires_grad_(),
        old_logprobs=t(OLD),
        teacher_logprobs=t(Q),
        advantages=t([adv] * 3 + [0.0]),
        mask=torch.tensor([MASK4], dtype=torch.bool),
        **kw,
    )


@pytest.mark.parametrize("adv", [1.3, -0.7])
def test_method_values_by_hand(adv):
    a = [adv] * 4
    lam, beta = 0.01, 5.0
    expected = {
        "grpo": _ppo(a),
        "sdar": _ppo(a) + lam * _gated(beta),
        "opsd": lam * _gated(beta),  # the gated term alone, weight lambda
        "grpo_opsd": _ppo(a) + lam * _gated(0.0),  # beta 0: gate 0.5 on every token
    }
    for method, value in expected.items():
        assert _loss(method, adv, sdar_coef=lam, gate_beta=beta)[0].item() == pytest.approx(
            value, rel=1e-9
        ), method


def test_sdar_hand_number():
    # adv 1: ratios e^0.2, 1, e^-1.4 -> PPO terms max(-1.2214, -1.2) = -1.2, -1, max(-0.2466, -0.8) = -0.2466;
    # gaps q - s = 0.5, -1, 1 -> gated 0.5 sig(2.5) = 0.46207, -sig(-5) = -0.00669, sig(5) = 0.99331
    pg = (-1.2 - 1.0 - math.exp(-1.4)) / 3
    gated = (0.5 * _sig(2.5) - _sig(-5.0) + _sig(5.0)) / 3
    assert pg + 0.01 * gated == pytest.approx(-0.8155323 + 0.01 * 0.4828951, rel=1e-6)
    loss, _ = _loss("sdar", 1.0)
    assert loss.item() == pytest.approx(-0.8107034, rel=1e-6)


def test_skill_sd_value_by_hand():
    terms = []
    for s, q, o in zip(S, Q, OLD):
        ell = s - q
        terms.append(math.exp(min(s - o, 10)) * (math.exp(min(-ell, 20)) - 1 + ell))
    expected = _ppo([0.8] * 4) + 0.001 * _mean(terms)
    assert _loss("skill_sd", 0.8)[0].item() == pytest.approx(expected, rel=1e-9)
    assert _loss("skill_sd", 0.8, skill_sd_coef=0.5)[0].item() == pytest.approx(
        _ppo([0.8] * 4) + 0.5 * _mean(terms), rel=1e-9
    )


@pytest.mark.parametrize(("adv", "step"), [(1.3, 1), (-0.7, 1), (1.3, 60), (1.3, 100)])
def test_rlsd_value_by_hand(adv, step):
    lam = 0.5 * max(0.0, 1 - step / 100)
    sign = 1 if adv > 0 else -1
    # re-weighted with the rollout (old) log-probs, not the current ones
    a = [adv * ((1 - lam) + lam * min(max(math.exp(sign * (q - o)), 0.8), 1.2)) for q, o in zip(Q, OLD)]
    loss, m = _loss("rlsd", adv, step=step)
    assert loss.item() == pytest.approx(_ppo(a), rel=1e-9)
    assert m["rlsd/lambda"] == pytest.approx(lam)
    if step >= 100:
        assert loss.item() == pytest.approx(_loss("grpo", adv)[0].item(), rel=1e-12)


@pytest.mark.parametrize("method", ["grpo", "sdar", "opsd", "grpo_opsd", "rlsd", "skill_sd"])
def test_every_method_adds_the_kl_term(method):
    ref = torch.tensor([REF], dtype=torch.float64)
    base, _ = _loss(method, 0.9)
    with_kl, m = _loss(method, 0.9, ref_logprobs=ref, kl_coef=0.01)
    assert with_kl.item() == pytest.approx(base.item() + 0.01 * _k3_kl(), rel=1e-9)
    assert m["actor/kl_loss"] == pytest.approx(_k3_kl(), rel=1e-9)
    assert m["loss/total"] == pytest.approx(with_kl.item(), rel=1e-9)


def test_kl_kind_and_missing_reference():
    ref = torch.tensor([REF], dtype=torch.float64)
    loss, _ = _loss("grpo", 0.9, ref_logprobs=ref, kl_coef=0.1, kl_kind="mse")
    k2 = _mean([0.5 * (s - r) ** 2 for s, r in zip(S, REF)])
    assert loss.item() == pytest.approx(_ppo([0.9] * 4) + 0.1 * k2, rel=1e-9)
    with pytest.raises(ValueError, match="ref_logprobs"):
        _loss("grpo", 0.9, kl_coef=0.01)


def test_dual_clip_is_on_by_default_and_can_be_turned_off():
    a = [-2.0] * 4
    assert _loss("grpo", -2.0)[0].item() == pytest.approx(_ppo(a, c=3.0), rel=1e-9)
    assert _loss("grpo", -2.0, clip_ratio_c=0)[0].item() == pytest.approx(_ppo(a, c=math.inf), rel=1e-9)


def test_reductions_to_grpo():
    batch = _batch(4)
    grpo, _ = _call("grpo", **batch)
    assert _call("rlsd", rlsd_lam=0.0, **batch)[0].item() == pytest.approx(grpo.item())
    assert _call("sdar", sdar_coef=0.0, **batch)[0].item() == pytest.approx(grpo.item())
    assert _call("skill_sd", skill_sd_coef=0.0, **batch)[0].item() == pytest.approx(grpo.item())


def test_grpo_needs_no_teacher_but_distillers_do():
    batch = _batch(5, teacher_logprobs=None)
    loss, _ = _call("grpo", **batch)
    assert math.isfinite(loss.item())
    with pytest.raises(ValueError, match="teacher_logprobs"):
        _call("sdar", **batch)


def test_per_episode_advantages_are_rejected():
    with pytest.raises(ValueError, match="advantages"):
        _call("grpo", **_batch(6, advantages=torch.randn(B)))


def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        _call("sdra", **_batch())
    assert isinstance(err.value, ValueError)
    for name in METHODS:
        assert name in str(err.value)


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_method("sdar")(lambda x: x)


# One SGD step on a tiny linear policy, in two cases where every token's pull is the same: the sampled tokens'
# mean log-prob must rise where a method has a reason to raise it and stay put where it has none.
# Case "advantage": A = +1 on every token, teacher = rollout log-probs (no gap). Every method's policy gradient
# raises the tokens; the gated term g * (q - s) also pulls s up at zero gap (its gradient is -g, g = 0.5).
# Case "teacher": A = 0, teacher 1 nat above the rollout on every token: only the distillers move, upward.
RAISES = {
    "advantage": {
        "grpo": True,
        "sdar": True,
        "opsd": True,
        "grpo_opsd": True,
        "rlsd": True,
        "skill_sd": True,
    },
    "teacher": {
        "grpo": False,
        "sdar": True,
        "opsd": True,
        "grpo_opsd": True,
        "rlsd": False,
        "skill_sd": True,
    },
}


@pytest.mark.parametrize("case", sorted(RAISES))
@pytest.mark.parametrize("method", METHODS)
def test_one_step_moves_the_sampled_tokens_the_right_way(method, case):
    torch.manual_seed(7)
    vocab, hidden = 11, 8
    policy = torch.nn.Linear(hidden, vocab)
    states = torch.randn(B, T, hidden)
    actions = torch.randint(0, vocab, (B, T))
    mask = torch.ones(B, T, dtype=torch.bool)

    def mean_logprob():
        return token_logprobs(policy(states), actions, chunk_size=5)

    with torch.no_grad():
        old = mean_logprob()
    advantages = torch.full((B, T), 1.0 if case == "advantage" else 0.0)
    teacher = old + (1.0 if case == "teacher" else 0.0)
    loss, _ = _call(
        method,
        logprobs=mean_logprob(),
        old_logprobs=old,
        teacher_logprobs=teacher,
        advantages=advantages,
        mask=mask,
        sdar_coef=0.1,
    )
    loss.backward()
    before = policy.weight.detach().clone()
    torch.optim.SGD(policy.parameters(), lr=0.05).step()
    with torch.no_grad():
        change = float((mean_logprob() - old).mean())
    if RAISES[case][method]:
        assert change > 1e-6
    else:
        assert torch.equal(policy.weight, before) and change == 0.0


def test_aux_grad_share_by_hand():
    """pg = a . theta and aux = 0.01 * (b . theta): the gradients are a and 0.01 b, so with |a| = 5 (3, 0, 4) and
    |b| = 1 the share is 0.01 / 5 = 0.002."""
    theta = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    pg = (torch.tensor([3.0, 0.0, 4.0]) * theta).sum()
    aux = 0.01 * (torch.tensor([0.0, 1.0, 0.0]) * theta).sum()
    share = aux_grad_share({"pg": pg, "aux": aux, "kl": theta.sum()}, [theta])
    assert share["grad/pg_norm"] == pytest.approx(5.0)
    assert share["grad/aux_norm"] == pytest.approx(0.01)
    assert share["grad/aux_share"] == pytest.approx(0.002)
    (pg + aux).backward()  # the graph is kept for the update's own backward
    assert theta.grad.tolist() == pytest.approx([3.0, 0.01, 4.0])


def test_aux_grad_share_spans_every_parameter_and_is_none_without_a_term():
    # over two tensors: |grad pg| = |(3, 4)| = 5 from two parameters, |grad aux| = |(0, 0.5)| = 0.5
    u, v = torch.tensor(1.0, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    share = aux_grad_share({"pg": 3 * u + 4 * v, "aux": 0.5 * v}, [u, v])
    assert share["grad/aux_share"] == pytest.approx(0.1)
    assert aux_grad_share({"pg": 3 * u}, [u]) == {
        "grad/aux_share": None,
        "grad/pg_norm": pytest.approx(3.0),
        "grad/aux_norm": None,
    }
    # a policy gradient of 0 (every advantage 0) has no share
    assert aux_grad_share({"pg": 0 * u, "aux": 2 * u}, [u])["grad/aux_share"] is None
    assert aux_grad_share({"aux": 2 * u}, [u])["grad/pg_norm"] is None


@pytest.mark.parametrize("method", METHODS)
def test_method_loss_is_the_sum_of_its_terms(method):
    batch = _batch()
    cfg = Objective(method=method, kl_coef=0.01, entropy_coef=0.1)
    ref = batch["old_logprobs"] - 0.1
    entropy = batch["logprobs"].abs()
    terms, _ = method_terms(**batch, cfg=cfg, ref_logprobs=ref, entropy=entropy)
    loss, metrics = method_loss(**batch, cfg=cfg, ref_logprobs=ref, entropy=entropy)
    assert float(loss) == pytest.approx(float(sum(terms.values())))
    assert metrics["loss/total"] == pytest.approx(float(loss))
    assert set(terms) <= {"pg", "aux", "kl", "entropy"} and {"kl", "entropy"} <= set(terms)
    # the aux term is weighted by its coefficient: the recorded loss/aux is the unweighted one
    if "aux" in terms:
        assert float(terms["aux"]) == pytest.approx(metrics["loss/aux_coef"] * metrics["loss/aux"])
