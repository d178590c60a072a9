"""Every registry version's README.md is a model card generated from its lineage and evaluation, not PEFT's
unfilled template; the adapter folder it came from is left as it was."""

from __future__ import annotations

from pathlib import Path

from sdarflow.registry import Registry

TEMPLATE = "# Model Card for Model ID\n\n[More Information Needed]\n"


def test_register_writes_a_model_card(local_registry, make_adapter, tasks):
    adapter = make_adapter()
    (adapter / "README.md").write_text(TEMPLATE)  # what PEFT's save_pretrained writes
    lineage = {"run_id": "nightly_*1*", "round": 1, "method": "sdar", "base_model": "s3://models/qwen-7b",
               "data": ["s3://d/round=1/generate", "s3://d/round=1/rescore"]}  # fmt: skip
    reg = Registry(local_registry)
    base = tasks([1] * 10, [2] * 10, adapter="base")
    version = reg.register("agent", adapter, tasks([3] * 9 + [2], [2] * 10), lineage, base_eval_report=base,
                           actor="kfp-run:abc")  # fmt: skip
    card = (Path(reg.fetch_adapter("agent", version)) / "README.md").read_text()
    assert (
        adapter / "README.md"
    ).read_text() == TEMPLATE  # the source folder's file, hard-linked, is untouched
    assert "More Information Needed" not in card
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    assert (
        'library_name: "peft"' in front and 'base_model: "s3://models/qwen-7b"' in front and '"sdar"' in front
    )
    assert body.lstrip().startswith("# agent v1\n")
    assert "- registered by: kfp-run:abc" in body and "- method: sdar" in body
    # the evaluation: pass@1 (3 of 4 on nine tasks, 2 of 4 on one) = 0.725; the base model's 0.250 beside it
    assert "| this version | test | 0.725 |" in body and "| base model | test | 0.250 |" in body
    assert "| 10 x 4 |" in body
    # lineage values are escaped: a run id's '*' and '_' cannot turn into emphasis
    assert "nightly\\_\\*1\\*" in body
    assert "s3://d/round=1/generate, s3://d/round=1/rescore" in body
    assert (
        "vllm serve s3://models/qwen\\-7b \\-\\-enable\\-lora" in body
        or "vllm serve s3://models/qwen-7b" in body
    )


def test_the_cards_commands_quote_a_base_named_by_lineage(local_registry, make_adapter, tasks):
    """Lineage is data: a base model named like a shell command stays one argument in the card's lines."""
    hostile = "m; touch /tmp/pwned"
    reg = Registry(local_registry)
    version = reg.register("agent", make_adapter(), tasks([2] * 10, [2] * 10), {"base_model": hostile})
    card = (Path(reg.fetch_adapter("agent", version)) / "README.md").read_text()
    assert "vllm serve 'm; touch /tmp/pwned' " in card.replace("\\", "")
    assert "from_pretrained('m; touch /tmp/pwned')" in card.replace("\\", "")
