"""What the benchmarks count: forward FLOPs by hand, and the agent length distribution the rescoring benchmark
draws."""

from __future__ import annotations

import pytest
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench.common import forward_flops
from bench.generation import GRID_BATCHES, call_flops, grid_shapes
from bench.rescoring import agent_lengths


@pytest.mark.parametrize("tied", [True, False])
def test_forward_flops_by_hand(tied):
    # hidden 4, one layer, one head (head_dim 4), intermediate 8: q, k, v 4x4 + bias 4 each = 60, o 16, the MLP
    # 3 x 32 = 96, two norms 8, the final norm 4 -> 184 decoder weights; the 10 x 4 head costs 2 x 40 per token
    # it runs on, whether or not it shares the embedding's weights
    config = Qwen2Config(vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=tied)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    # causal attention: a row of L tokens has L^2 / 2 query-key pairs; QK^T and AV each cost a multiply-add (2
    # FLOPs) per pair and per hidden unit, in each of the 1 layers
    pairs = 3 * 3 / 2 + 5 * 5 / 2
    attention = 1 * pairs * 2 * 2 * 4
    assert forward_flops(model, [3, 5], head_tokens=2) == 2 * 184 * 8 + attention + 2 * 40 * 2
    assert forward_flops(model, [3, 5]) == 2 * 184 * 8 + attention + 2 * 40 * 8


def test_a_calls_flops_count_each_distinct_prompt_once_and_every_rows_new_tokens():
    config = Qwen2Config(vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1)  # fmt: skip
    model = Qwen2ForCausalLM(config)  # 184 decoder weights, a 10 x 4 head (above)
    # two rows of one 3-token prompt, 2 new tokens each: the prompt's 3 tokens once and 4 new tokens through the
    # decoder; attention pairs: the prompt's 3^2 / 2 once, then each row's new tokens over its context,
    # (5^2 - 3^2) / 2; the head on the 4 new tokens
    pairs = 3 * 3 / 2 + 2 * (5 * 5 - 3 * 3) / 2
    assert call_flops(model, [[1, 2, 3], [1, 2, 3]], 2) == 2 * 184 * 7 + pairs * 2 * 2 * 4 + 2 * 40 * 4
    # a second distinct prompt is counted whole
    one = call_flops(model, [[1, 2, 3]], 2)
    assert call_flops(model, [[1, 2, 3], [4, 5, 6]], 2) == 2 * one


def test_the_generation_grid_calls_groups_of_eight_samples_of_first_turn_and_long_prompts(tiny_model):
    from sdarflow.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model))
    messages = [[{"role": "user", "content": f"Task {i}: cook the meal in room {i}."}] for i in range(32)]
    shapes = grid_shapes(tokenizer, messages)
    assert [s["batch"] for s in shapes] == list(GRID_BATCHES) * 3
    assert {(s["kind"], s["new_tokens"]) for s in shapes} == {
        ("first turn", 32),
        ("first turn", 128),
        ("long", 32),
    }
    for s in shapes:
        distinct = {tuple(p) for p in s["prompts"]}
        assert len(s["prompts"]) == s["batch"] and len(distinct) == max(1, s["batch"] // 8)
    first = next(s for s in shapes if s["kind"] == "first turn" and s["batch"] == 64)
    long = next(s for s in shapes if s["kind"] == "long" and s["batch"] == 64)
    # a long prompt holds four first-turn messages in one, the next long prompt the next four
    texts = [tokenizer.decode(long["prompts"][i]) for i in (0, 8)]
    held = [[t for t in range(9) if f"Task {t}:" in text] for text in texts]
    assert held == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(long["prompts"][0]) > 2 * len(first["prompts"][0])


def test_agent_lengths_grow_with_the_history_within_bounds():
    prompts, responses = agent_lengths(200, seed=3)
    assert len(prompts) == len(responses) == 200
    assert all(300 <= p <= 3000 for p in prompts) and all(20 <= r <= 300 for r in responses)
    growing = sum(b > a for a, b in zip(prompts, prompts[1:]))
    assert growing > 150  # within an episode every turn adds history; a new episode starts short again
    assert max(prompts) == 3000 and min(prompts) < 500
    assert agent_lengths(200, seed=3) == (prompts, responses) != agent_lengths(200, seed=4)


def test_the_startup_probe_times_every_phase_of_a_model_task_and_of_a_task_without_one(tiny_model, tmp_path):
    from bench.common import demo_settings
    from bench.startup import _probe
    from sdarflow.pipeline_config import PipelineConfig, prepare

    config_uri = prepare(
        PipelineConfig.from_dict(demo_settings(str(tiny_model), str(tmp_path / "store"), "t"))
    )
    train = _probe("train", "train", config_uri, str(tiny_model))
    register = _probe("register", "register", config_uri, str(tiny_model))
    phases = {"interpreter_s", "imports_s", "config_cold_s", "model_cold_s", "config_warm_s", "model_warm_s"}
    assert set(train) == set(register) == phases
    assert all(v >= 0 for v in [*train.values(), *register.values()])
    assert train["imports_s"] > 0.1 and train["model_cold_s"] > train["model_warm_s"] > 0  # loaded, twice
    assert register["model_cold_s"] == register["model_warm_s"] == 0.0  # register loads no model
