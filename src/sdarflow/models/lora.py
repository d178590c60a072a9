"""A LoRA adapter's rank as vLLM needs it: the largest rank in ``adapter_config.json`` (``r`` and any per-module
``rank_pattern``), rounded up to a ``--max-lora-rank`` value vLLM accepts. Rollouts, intake and serving all use
these two functions, so an adapter served is an adapter sampled from."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sdarflow.errors import ModelError

# The values vLLM's --max-lora-rank accepts (vllm.config.lora.MaxLoRARanks); a rank is rounded up to one.
VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank(adapter_config: Mapping[str, Any]) -> int | None:
    """The largest LoRA rank (``r`` and any per-module ``rank_pattern``); None when the config declares none."""
    ranks = [adapter_config.get("r"), *dict(adapter_config.get("rank_pattern") or {}).values()]
    ints = [r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r > 0]
    return max(ints) if ints else None


def max_lora_rank(ranks: Iterable[int]) -> int:
    """vLLM's ``--max-lora-rank`` for adapters of these LoRA ranks: the largest, rounded up to a value vLLM
    accepts."""
    rank = max(ranks)
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ModelError(
        f"LoRA rank {rank} is above vLLM's maximum {VLLM_LORA_RANKS[-1]}; allowed --max-lora-rank values: "
        f"{', '.join(map(str, VLLM_LORA_RANKS))}; fix: train the adapter with a smaller r"
    )
