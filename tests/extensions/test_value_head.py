"""The learned value head of the negative-value filter: the states it reads (the policy's hidden state at a
prompt's last token, padding-free), its fit and its file, and the train stage's warm-up rounds, in which only the
head trains."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch
from factories import adapter_weights, rescored_table

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.errors import ModelError
from sdarflow.extensions.value_head import VALUE_FILE, ValueHead
from sdarflow.models.forward import prompt_states
from sdarflow.schema import RESCORED_SCHEMA


def test_prompt_states_are_each_prompts_own_last_hidden_state(tiny_model):
    from sdarflow.models import load_policy

    model = load_policy(str(tiny_model)).model.eval()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    # a budget of 6 tokens: batches of one and two left-padded prompts
    got = prompt_states(model, prompts, pad_id=0, max_tokens=6, device=torch.device("cpu"))
    assert got.shape == (3, model.config.hidden_size) and got.dtype == torch.float32
    for i, p in enumerate(prompts):
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0, -1]
        torch.testing.assert_close(got[i], alone.float(), atol=1e-5, rtol=1e-4)


def test_value_head_fits_saves_and_reports_its_error_before_and_after(tmp_path):
    # unit features e_0 and e_1: returns 1 and 0 are a linear function of them
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0])
    head = ValueHead()
    values, metrics = head.fit(features * 3, returns)  # scale does not matter: the states are normalized
    assert values.tolist() == pytest.approx([1, 0, 1, 0], abs=0.05)
    assert metrics["value/mse"] < 1e-3 and metrics["value/rounds"] == 1.0 and "value/prior_mse" not in metrics
    assert metrics["value/target_var"] == pytest.approx(0.25)
    head.save(tmp_path)
    again = ValueHead.load(str(tmp_path))
    assert again.rounds == 1 and torch.equal(again.weights, head.weights)
    # the next round: the previous head's error on the new round (before it sees it) is reported
    _, metrics = again.fit(features, 1 - returns)
    assert metrics["value/prior_mse"] == pytest.approx(1.0, abs=0.1) and metrics["value/rounds"] == 2.0
    with pytest.raises(ModelError, match="takes 2 features, but the model's hidden size is 3; fix:"):
        again.fit(torch.ones(2, 3), torch.ones(2))
    assert ValueHead.load(str(tmp_path / "missing")).weights is None and ValueHead.load("").rounds == 0


def _publish(table: pa.Table, uri: str) -> str:
    storage.write_table(table, uri, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[])
    return uri


def _in_round(table: pa.Table, r: int) -> pa.Table:
    return table.set_column(
        table.schema.get_field_index("round"), "round", pa.array([r] * table.num_rows, pa.int32())
    )


def test_warmup_rounds_fit_only_the_head_then_the_head_drives_the_filter(tiny_model, tmp_path):
    head_flags = ["--filter", "negative-value", "--value-estimate", "head", "--value-warmup-rounds", "1"]
    base = ["--model", str(tiny_model), "--max-steps", "2", *head_flags]
    warm = str(tmp_path / "warm")
    assert (
        main(["train", "--input", _publish(rescored_table(), str(tmp_path / "r0")), *base, "--output", warm])
        == 0
    )
    summary = json.loads(storage.read_member(warm, "train_summary.json"))
    assert summary["train/steps"] == 0.0 and summary["value/rounds"] == 1.0
    assert summary["objective"]["value_warmup_rounds"] == 1
    # the policy did not move: a new LoRA's B matrices are still 0, so the adapter is the base model
    assert all(float(w.abs().max()) == 0.0 for k, w in adapter_weights(warm).items() if "lora_B" in k)
    assert (tmp_path / "warm" / VALUE_FILE).is_file()

    trained = str(tmp_path / "trained")
    r1 = _publish(_in_round(rescored_table(seed=1), 1), str(tmp_path / "r1"))
    assert main(["train", "--input", r1, *base, "--adapter", warm, "--output", trained]) == 0
    summary = json.loads(storage.read_member(trained, "train_summary.json"))
    assert summary["train/steps"] == 2.0 and summary["value/rounds"] == 2.0 and "value/prior_mse" in summary
    assert 0.0 <= summary["filter/dropped_share"] < 1.0
    assert any(float(w.abs().max()) > 0 for k, w in adapter_weights(trained).items() if "lora_B" in k)


@pytest.mark.parametrize(
    "flags",
    [["--value-estimate", "head"], ["--filter", "negative-value", "--value-warmup-rounds", "1"]],
)
def test_value_head_settings_need_the_filter_and_the_head(tiny_model, rescored, tmp_path, capsys, flags):
    args = ["train", "--input", rescored, "--model", str(tiny_model), "--output", str(tmp_path / "a"), *flags]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--filter negative-value --value-estimate head" in err
    assert not storage.is_published(str(tmp_path / "a"))
