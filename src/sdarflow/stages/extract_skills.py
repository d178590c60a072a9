"""Stage ``extract-skills``: a versioned skill library mined from a round's trajectories, merged into the previous
library (or a seed library) so task types not solved this round keep their skills.

``extractor: rule`` mines hindsight action patterns (``sdarflow.skills.extract``); ``extractor: llm`` has a chat
model write each task type's skill from contrasting episodes (``sdarflow.skills.llm``), with the general skill
still mined by rule. The previous library's evidence is re-measured on this round's episodes before merging, and
its bandit statistics (``ucb`` retrieval) are updated from the previous round's rescored rows (``--rescored``).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sdarflow import storage
from sdarflow.config import StageConfig, opt
from sdarflow.envs import get_suite
from sdarflow.errors import ConfigError
from sdarflow.extensions.skill_bandit import carry_over, updated_stats
from sdarflow.models.device import device_opt
from sdarflow.report import Report, Section, html, markdown, number
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.skills.accuracy import VERDICTS, score_library
from sdarflow.skills.extract import MIN_SUPPORT, episodes_from_rows, extract_skills
from sdarflow.skills.library import GENERAL, SkillLibrary
from sdarflow.skills.merge import merge, reevaluate
from sdarflow.stages.common import allow_unpublished_opt, load_skills, local_artifact, once, require

log = logging.getLogger(__name__)

EXTRACTORS = ("rule", "llm")
LLM_BACKENDS = ("openai", "engine")


@dataclass
class ExtractSkillsConfig(StageConfig):
    stage = "extract-skills"
    input: list[str] = opt([], "trajectory dataset URI(s) (the union of a round's shards)", reads=True)
    output: str = opt("", "output skill library URI", io=True)
    previous: str = opt("", "previous library (published URI or folder) to merge into", reads=True)
    rescored: list[str] = opt(
        [],
        "previous round's rescored dataset(s), scored with --previous: updates the ucb statistics",
        reads=True,
    )
    extractor: str = opt(
        "rule", "rule (hindsight action patterns) or llm (a chat model writes skills)", choices=EXTRACTORS
    )
    min_support: int = opt(
        MIN_SUPPORT,
        "solved tasks a task type, a direction rule or a replacement needs (docs/skills.md: how it was set)",
        ge=1,
    )
    min_win_share: float = opt(
        0.5, "a step is kept if at least this share of successes contain it", ge=0, le=1
    )
    min_lift: float = opt(
        0.0, "rule skills are kept only if followers' success rate beats non-followers' by more", ge=-1, le=1
    )
    follow_share: float = opt(
        0.5, "an episode followed a skill if it contains this share of its steps, (0, 1]", gt=0, le=1
    )
    dedupe_threshold: float = opt(
        0.8, "a new skill whose steps overlap an existing one this much (Jaccard) is merged", gt=0, le=1
    )
    llm_backend: str = opt(
        "openai", "llm extractor: an OpenAI-compatible endpoint or our engine", choices=LLM_BACKENDS
    )
    llm_base_url: str = opt("", "openai backend: base URL ending in /v1, e.g. http://vllm:8000/v1")
    llm_model: str = opt("", "openai backend: model name the endpoint serves")
    llm_api_key_env: str = opt("OPENAI_API_KEY", "openai backend: environment variable holding the API key")
    llm_max_tokens: int = opt(256, "llm extractor: tokens per written skill", ge=1)
    llm_temperature: float = opt(0.0, "llm extractor: sampling temperature (0 = greedy)", ge=0)
    llm_timeout_s: float = opt(60.0, "openai backend: seconds per request", gt=0)
    llm_episodes: int = opt(
        3, "llm extractor: successful and failed episodes shown per task type (each)", ge=1
    )
    model: str = opt("", "engine backend: base model HF folder (the policy)", reads=True)
    adapter: str = opt(
        "",
        "engine backend: the policy's adapter (published URI or PEFT folder) or full fine-tune",
        reads=True,
    )
    device: str = device_opt()
    allow_unpublished: bool = allow_unpublished_opt()
    overwrite: bool = opt(False, "replace an existing library at --output", io=True)

    def validate(self) -> None:
        if (
            self.extractor == "llm"
            and self.llm_backend == "openai"
            and not (self.llm_base_url and self.llm_model)
        ):
            raise ConfigError(
                "extract-skills: extractor llm with llm_backend openai needs --llm-base-url and --llm-model; "
                "fix: pass both, or use --llm-backend engine (the policy writes the skills)"
            )
        if self.llm_base_url and not self.llm_base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"extract-skills: llm_base_url {self.llm_base_url!r} must be an http(s) URL; "
                f"fix: pass e.g. http://vllm:8000/v1"
            )


Config = ExtractSkillsConfig  # the stage's exports are Config and run (sdarflow.stages)


def _backend(cfg: ExtractSkillsConfig):
    from sdarflow.skills.llm import EngineChat, OpenAIChat

    if cfg.llm_backend == "openai":
        return OpenAIChat(cfg.llm_base_url, cfg.llm_model, cfg.llm_api_key_env, cfg.llm_timeout_s)
    from sdarflow.models import load_policy

    require("extract-skills (llm_backend engine)", model=cfg.model)
    adapter = local_artifact(cfg.adapter, "adapter", cfg.allow_unpublished, full_model=True)
    return EngineChat(load_policy(cfg.model, adapter, device=cfg.device))


def _new_skills(
    cfg: ExtractSkillsConfig, episodes, round_: int | None
) -> tuple[SkillLibrary, dict[str, str]]:
    """This round's skills (rule-mined, or written by the LLM extractor with a rule-mined general skill) and the
    LLM-written ones rejected, with why."""
    new = extract_skills(
        episodes,
        min_support=cfg.min_support,
        min_win_share=cfg.min_win_share,
        min_lift=cfg.min_lift,
        follow_share=cfg.follow_share,
        origin={"source": "rule", "round": round_},
    )
    rejected: dict[str, str] = {}
    if cfg.extractor == "llm":
        from sdarflow.skills.llm import llm_extract

        written, rejected = llm_extract(
            episodes,
            _backend(cfg),
            min_support=cfg.min_support,
            per_side=cfg.llm_episodes,
            max_tokens=cfg.llm_max_tokens,
            temperature=cfg.llm_temperature,
            follow_share=cfg.follow_share,
            round_=round_,
        )
        if new.general:  # the general skill stays rule-mined: it needs every task type's successes
            written.skills[GENERAL] = new.general
        new = written
    return new, rejected


def _shown(value) -> str:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(x, float) for x in value):
        return f"[{number(value[0], 2)}, {number(value[1], 2)}]"  # an interval
    return number(value, 2)


def _evidence(evidence: Mapping) -> str:
    """The evidence's figures as one line (the rules, and what a side says, are shown on their own)."""
    parts = [
        f"{k} {_shown(v)}"
        for k, v in sorted(evidence.items())
        if v is not None and k not in ("rules", "action", "steps")
    ]
    return ", ".join(parts) or "-"


def _side(evidence: Mapping) -> str:
    said = evidence["action"] if "action" in evidence else "; ".join(evidence.get("steps", []))
    return f"{said} ({_evidence(evidence)})"


def _provenance(lib: SkillLibrary, decisions: Sequence[Mapping]) -> list[Section]:
    """Each direction rule with its provenance, and the contested replacements with both sides' evidence."""
    rules = [
        [name, f"{d}: {r['action']}", _evidence(r)]
        for name, s in lib.skills.items()
        for d, r in s.evidence.get("rules", {}).items()
    ]
    contested = [
        [d["skill"], d["rule"], "replaced" if d["replaced"] else "kept previous", _side(d["previous"]), _side(d["new"])]
        for d in decisions
    ]  # fmt: skip
    title = (
        "Contested replacements (the new side must beat the previous: at least min_support solved tasks and a "
        "success-rate interval wholly above)"
    )
    return [
        Section("Direction rules and their provenance", table=(["skill", "rule", "evidence"], rules)),
        Section(title, table=(["skill", "rule", "decision", "previous", "new"], contested)),
    ]


def library_report(
    lib: SkillLibrary,
    previous: SkillLibrary | None,
    new: Sequence[str],
    rejected: Mapping[str, str],
    title: str,
    accuracy: Mapping | None = None,
    decisions: Sequence[Mapping] = (),
) -> Report:
    """The stage's report: each skill of ``lib`` as added, changed or kept against ``previous``, with its evidence
    and text; the rules' provenance and the contested replacements; ``accuracy`` (``score_library``) per skill."""

    def status(name: str) -> str:
        if previous is None or name not in previous.skills:
            return "added"
        return "changed" if previous.skills[name].text != lib.skills[name].text else "kept"

    rows = [
        [name, ", ".join(s.task_types) or ("all (general)" if lib.is_general(s) else "-"), str(len(s.steps)),
         status(name), _evidence(s.evidence)]
        for name, s in lib.skills.items()
    ]  # fmt: skip
    sections = [
        Section("Skills", table=(["skill", "task types", "steps", "this round", "evidence"], rows)),
        *_provenance(lib, decisions),
        Section("Rejected this round (LLM-written skills, with why)", items=sorted(rejected.items())),
    ]
    if accuracy is not None:
        scored = [
            [name, *("; ".join(s[v]) or "-" for v in VERDICTS)] for name, s in accuracy["skills"].items()
        ]
        totals = ", ".join(f"{accuracy[v]} {v.replace('_', '-')}" for v in VERDICTS)
        sections.append(Section(f"Accuracy against the env: {totals}", table=(["skill", *VERDICTS], scored)))
    sections += [
        Section(f"Skill: {name}", text=" / ".join(s.text.splitlines())) for name, s in lib.skills.items()
    ]
    return Report(
        title=title,
        subtitle=f"library {lib.version}: {len(lib.skills)} skills, {len(new)} new this round",
        sections=sections,
    )


@once("skills")
def run(cfg: ExtractSkillsConfig) -> dict:
    require("extract-skills", input=cfg.input, output=cfg.output)
    table = storage.read_table(cfg.input, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    cols = ["task_id", "task_type", "traj_id", "turn", "response_text", "format_ok", "success"]
    cols.append("prompt_messages")  # the goal, so skills can spell out each recipe direction
    episodes = episodes_from_rows(table.select(cols).to_pylist())
    previous = load_skills(cfg.previous, cfg.allow_unpublished) if cfg.previous else None
    stats = updated_stats(cfg.rescored, previous)
    if previous is not None:
        previous = reevaluate(previous, episodes, follow_share=cfg.follow_share)
    rounds = table.column("round").unique().to_pylist()
    new, rejected = _new_skills(cfg, episodes, rounds[0] if len(rounds) == 1 else None)
    lib, decisions = merge(previous, new, cfg.min_support, cfg.dedupe_threshold)
    lib.stats = carry_over(stats, lib)
    # scored against the ground truth of the env the trajectories came from; None where it has none (or they mix)
    envs = table.column("env").unique().to_pylist()
    truth = getattr(get_suite(envs[0]), "skill_truth", None) if len(envs) == 1 and envs[0] else None
    accuracy = None if truth is None else score_library(lib, truth())
    metrics = {} if accuracy is None else {f"skills/rules_{v}": accuracy[v] for v in VERDICTS}
    metrics["skills/replacements_made"] = sum(d["replaced"] for d in decisions)
    metrics["skills/replacements_refused"] = sum(not d["replaced"] for d in decisions)
    with tempfile.TemporaryDirectory() as tmp:
        lib.save(tmp)
        title = f"extract-skills ({cfg.extractor})"
        doc = library_report(lib, previous, sorted(new.skills), rejected, title, accuracy, decisions)
        (Path(tmp) / "report.md").write_text(markdown(doc))
        (Path(tmp) / "report.html").write_text(html(doc))
        storage.publish_dir(
            tmp,
            cfg.output,
            kind="skills",
            overwrite=cfg.overwrite,
            version=lib.version,
            config_hash=cfg.config_hash(),
            inputs=list(cfg.input) + ([cfg.previous] if cfg.previous else []) + list(cfg.rescored),
            new_skills=sorted(new.skills),
            rejected=rejected,
            extractor=cfg.extractor,
            metrics=metrics,
            accuracy=accuracy,
            replacements=decisions,
        )
    log.info(
        "extract-skills: %d episodes -> %d new skills (%d rejected), library %s with %d skills",
        len(episodes),
        len(new.skills),
        len(rejected),
        lib.version,
        len(lib.skills),
    )
    return {
        "uri": cfg.output,
        "version": lib.version,
        "skills": sorted(lib.skills),
        "new_skills": sorted(new.skills),
        "rejected": rejected,
        "metrics": metrics,
    }
