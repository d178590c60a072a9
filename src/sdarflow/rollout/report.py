"""What a round's rollouts look like, for people: the generate stage's report (overall figures, success by task
type, a transcript of a solved and of a failed episode) and the transcript helpers the run report shares.

Pure functions of turn rows (``sdarflow.schema.TRAJECTORY_SCHEMA``) and the rollout's metrics; no I/O.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from sdarflow.report import Report, Section

OBSERVATION_CHARS = 240  # of each turn's observation in a transcript
# the columns transcripts and the per-episode figures read
TRANSCRIPT_COLUMNS = (
    "traj_id", "turn", "task_id", "task_type", "episode_return", "success", "format_ok", "response_text",
    "prompt_messages",
)  # fmt: skip

# metric key -> what the overview calls it
OVERVIEW = {
    "rollout/episodes": "episodes",
    "rollout/success": "success",
    "rollout/mean_return": "mean return",
    "rollout/mean_turns": "mean turns",
    "rollout/format_error_rate": "format errors (share of turns)",
    "rollout/context_exceeded": "episodes cut at the context limit",
    "rollout/identical_groups": "groups whose samples were token-identical",
    "rollout/env_errors": "env errors",
    "rollout/tokens_per_s": "generated tokens/s",
    "rollout/env_steps_per_s": "env steps/s",
}


def group_episodes(rows: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Turn rows grouped into episodes (by ``traj_id``, turns in order), episodes in id order."""
    by_episode: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_episode.setdefault(str(row["traj_id"]), []).append(row)
    return [sorted(turns, key=lambda r: r["turn"]) for _, turns in sorted(by_episode.items())]


def _observation(row: Mapping[str, Any]) -> str:
    """The observation the agent acted on: the last user message, from its "Observation:" on."""
    messages = json.loads(row["prompt_messages"]) if row.get("prompt_messages") else []
    user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    text = user.rsplit("Observation:", 1)[-1].strip()
    return text if len(text) <= OBSERVATION_CHARS else text[: OBSERVATION_CHARS - 1] + "…"


def transcript(turns: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One episode as JSON: task, return, success, and each turn's observation and action."""
    first = turns[0]
    return {
        "task_id": first["task_id"],
        "task_type": first["task_type"],
        "return": float(first["episode_return"]),
        "success": bool(first["success"]),
        "turns": [
            {"observation": _observation(t), "action": t["response_text"], "format_ok": bool(t["format_ok"])}
            for t in turns
        ],
    }


def transcript_section(title: str, t: Mapping[str, Any]) -> Section:
    rows = [
        [str(i), turn["observation"], turn["action"], "" if turn["format_ok"] else "unparsed"]
        for i, turn in enumerate(t["turns"])
    ]
    heading = f"{title} ({t['task_id']}, {t['task_type']}, return {t['return']:.2f})"
    return Section(heading, table=(["turn", "observation", "action", ""], rows))


def rollout_report(rows: Sequence[Mapping[str, Any]], metrics: Mapping[str, float], title: str) -> Report:
    """The generate stage's report."""
    eps = group_episodes(rows)
    overview = [
        [label, f"{metrics[key]:.3f}".rstrip("0").rstrip(".")]
        for key, label in OVERVIEW.items()
        if key in metrics
    ]
    by_type: dict[str, list[list[Mapping[str, Any]]]] = {}
    for ep in eps:
        by_type.setdefault(str(ep[0]["task_type"]), []).append(ep)
    types = [
        [
            kind,
            str(len(group)),
            f"{statistics.fmean(bool(ep[0]['success']) for ep in group):.3f}",
            f"{statistics.fmean(len(ep) for ep in group):.1f}",
            f"{statistics.fmean(not t['format_ok'] for ep in group for t in ep):.3f}",
        ]
        for kind, group in sorted(by_type.items())
    ]
    sections = [
        Section("Overview", table=(["", "value"], overview)),
        Section(
            "By task type", table=(["task type", "episodes", "success", "mean turns", "format errors"], types)
        ),
    ]
    for name, won in (("A solved episode", True), ("A failed episode", False)):
        ep = next((ep for ep in eps if bool(ep[0]["success"]) == won), None)
        if ep is not None:
            sections.append(transcript_section(name, transcript(ep)))
    return Report(title=title, subtitle=f"{len(eps)} episodes, {len(rows)} turn rows", sections=sections)
