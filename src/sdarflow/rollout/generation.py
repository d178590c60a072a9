"""What a generation engine is: prompts (token ids) in; sampled tokens, their log-probs and text out.

Every engine exposes its tokenizer, EOS id and context length (so prompts are checked before any generation) and
``close()``. Log-probs are of the raw policy (temperature 1, float32 ``log_softmax``), the same quantity the trainer
computes, so the engine/trainer gap measures numerical drift rather than a definitional difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finished: bool  # ended with EOS rather than hitting max_new_tokens


class GenerationEngine(Protocol):
    tokenizer: object
    eos_id: int
    max_context: int  # tokens of prompt + response the model accepts

    def close(self) -> None: ...

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        min_new_tokens: int = 0,  # EOS is not sampled before this many tokens (fixed-length benchmarks)
    ) -> list[Sample]: ...
