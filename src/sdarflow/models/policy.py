"""Load a policy (any HF causal-LM folder) with an optional PEFT LoRA adapter or a full fine-tune of it in the
adapter's place, and attach new LoRA adapters."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

import torch
from safetensors import SafetensorError

from sdarflow.errors import ModelError
from sdarflow.models.identity import check_adapter, check_model_dir, check_trained_on, is_full_fine_tune

log = logging.getLogger(__name__)


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: object
    eos_id: int
    path: str


def policy_folders(base: str, adapter: str | None) -> tuple[str, str | None]:
    """(weights folder, LoRA adapter folder or None) of the policy "``base`` with ``adapter``": a full fine-tune of
    ``base`` where the adapter goes (what train publishes with ``--lora-rank 0``, so a round continues the last) is
    the weights itself, once it is checked to descend from ``base``."""
    if adapter and is_full_fine_tune(adapter):
        check_trained_on(adapter, base, "full fine-tune")
        return adapter, None
    return base, adapter


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    check_model_dir(path)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)  # never asks (check_model_dir refused)
    tok.padding_side = "left"  # decoder-only generation needs left padding
    return tok


def load_policy(
    path: str,
    adapter: str | None = None,
    trainable: bool = False,
    device: str = "auto",
    dtype: torch.dtype | None = None,
    flash_attention: bool = True,
) -> Policy:
    """The HF model folder ``path`` on ``device`` (on a GPU straight from the files, no copy in host memory), with
    the local PEFT ``adapter`` if given (its LoRA weights trainable when ``trainable``), or the full fine-tune of
    ``path`` given there (``policy_folders``). Weights are ``dtype``, else float32 when ``trainable``, else
    ``inference_dtype``. ``flash_attention``: flash-attention 2 for half-precision weights on a GPU with
    flash-attn; packed batches need it off (its packed path takes one row). On a CPU, a model on sdpa attends with
    ``attention.cpu_sdpa``."""
    from transformers import AutoModelForCausalLM

    from sdarflow.models.attention import cpu_attention
    from sdarflow.models.device import inference_dtype, pin_malloc_mmap_threshold, resolve_device

    pin_malloc_mmap_threshold()  # before any activation is allocated

    path, adapter = policy_folders(path, adapter)
    tokenizer = load_tokenizer(path)  # refuses a folder that is not an HF model
    place = resolve_device(device)
    dtype = dtype or (torch.float32 if trainable else inference_dtype(place))
    kwargs = {"dtype": dtype, "trust_remote_code": False}
    if place.type == "cuda":
        kwargs["device_map"] = {"": place}
    half = dtype != torch.float32
    if flash_attention and place.type == "cuda" and half and importlib.util.find_spec("flash_attn"):
        kwargs["attn_implementation"] = "flash_attention_2"
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, SafetensorError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelError(
            f"cannot load model from '{path}': {first}; fix: check the folder is a complete HF model"
        ) from err
    if place.type == "cpu" and model.config._attn_implementation == "sdpa":
        # only where sdpa runs: a model without it (eager only) or with its own attention table keeps its own
        model.set_attn_implementation(cpu_attention())
    if adapter:
        from peft import PeftModel

        check_adapter(adapter, path)
        try:
            model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
        except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
            first = str(err).strip().splitlines()[0]
            raise ModelError(
                f"adapter '{adapter}' is corrupt or incompatible: {first}; fix: re-export the adapter"
            ) from err
    model.to(place)
    model.train(trainable)
    log.info("model %s on %s (%s)", path, place, str(dtype).removeprefix("torch."))
    return Policy(model=model, tokenizer=tokenizer, eos_id=tokenizer.eos_token_id, path=path)


def new_lora(model, rank: int, alpha: int, targets: list[str] | None = None, dropout: float = 0.0):
    """``model`` with LoRA on ``targets`` (module names; None or empty: PEFT's ``all-linear``, every linear layer
    but the output head, found from the architecture: q/k/v/o and the MLP's on Qwen2 and Llama alike)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets) if targets else "all-linear",
        lora_dropout=dropout,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
