"""Load a policy (any HF causal-LM folder) with an optional PEFT LoRA adapter, and attach new LoRA adapters."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from sdarflow.errors import ModelError

log = logging.getLogger(__name__)

# Written beside adapter_config.json: which base model (by fingerprint) the adapter was trained on.
BASE_FILE = "base_model.json"
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: object
    eos_id: int
    path: str


def _check_model_dir(path: str) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ModelError(
            f"model folder '{path}' not found or has no config.json; fix: pass an HF model folder "
            f"(build the demo model with `sdarflow build-model --out DIR`)"
        )
    return p


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    _check_model_dir(path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"  # decoder-only generation needs left padding
    return tok


def load_policy(
    path: str, adapter: str | None = None, trainable: bool = False, dtype=torch.float32
) -> Policy:
    """Load the base model from an HF folder; apply ``adapter`` (a local PEFT folder) if given.

    ``trainable`` keeps the adapter's LoRA weights trainable (continuing RL on the newest adapter).
    """
    from transformers import AutoModelForCausalLM

    _check_model_dir(path)
    tokenizer = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as err:
        raise ModelError(
            f"cannot load model from '{path}': {err}; fix: check the folder is a complete HF model"
        ) from err
    if adapter:
        model = attach_adapter(model, adapter, path, trainable)
    model.train(trainable)
    eos_id = tokenizer.eos_token_id
    return Policy(model=model, tokenizer=tokenizer, eos_id=eos_id, path=path)


def check_adapter(adapter: str, base_path: str) -> dict:
    """The adapter's PEFT config, after checking it was trained on ``base_path`` (ModelError otherwise)."""
    try:
        config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelError(
            f"adapter '{adapter}' has no readable adapter_config.json ({err}); fix: pass a PEFT folder"
        ) from err
    base_file = Path(adapter) / BASE_FILE
    recorded = json.loads(base_file.read_text()).get("fingerprint") if base_file.is_file() else None
    if recorded and recorded != base_fingerprint(base_path):
        raise ModelError(
            f"adapter '{adapter}' was trained on a different base model than '{base_path}' "
            f"(fingerprint {recorded} != {base_fingerprint(base_path)}); fix: pass the matching --model"
        )
    return config


def attach_adapter(model, adapter: str, base_path: str, trainable: bool):
    from peft import PeftModel

    check_adapter(adapter, base_path)
    try:
        return PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
    except (OSError, ValueError, RuntimeError, KeyError) as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(
            f"adapter '{adapter}' is corrupt or incompatible: {first}; fix: re-export the adapter"
        ) from err


def base_fingerprint(path: str) -> str:
    """Identity of a base model for adapter compatibility: its config.json content, not its (mount) path."""
    import hashlib

    return hashlib.sha256((_check_model_dir(path) / "config.json").read_bytes()).hexdigest()[:16]


def new_lora(model, rank: int, alpha: int, targets: list[str], dropout: float = 0.0):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=dropout, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, config)
