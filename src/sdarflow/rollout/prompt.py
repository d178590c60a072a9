"""How an agent turn is put to the policy: chat messages from the task, the recent actions and the current
observation; where the teacher's privileged skills go; and how a sampled response becomes an action.

This is the one place prompts are shaped: rollouts, SFT and the teacher all call these functions, so the student
and teacher contexts differ only by the inserted skills.
"""

from __future__ import annotations

import json
import re
from typing import Literal

SYSTEM_PROMPT = "You are an agent in a text game. Reply with exactly one command."
SKILLS_HEADER = "Skills:"
SkillPlace = Literal["system", "user"]
SKILL_PLACES: tuple[str, ...] = ("system", "user")

# A command is a short lower-case phrase: what text games and simple tool calls accept.
_ACTION_RE = re.compile(r"^[a-z0-9][a-z0-9 '\-]{0,63}$")
MAX_ACTION_WORDS = 8


def build_messages(
    instruction: str, actions: list[str], observation: str, history_turns: int = 4
) -> list[dict]:
    """Student context: system prompt, then goal + the last ``history_turns`` actions + the current observation."""
    recent = actions[-history_turns:] if history_turns > 0 else []
    history = "; ".join(recent) if recent else "none"
    user = f"Goal: {instruction}\nRecent actions: {history}\nObservation: {observation}\nCommand?"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def insert_skills(messages: list[dict], skills_text: str, place: SkillPlace = "system") -> list[dict]:
    """Teacher context: the same messages with ``skills_text`` added to the system or the last user message."""
    if not skills_text:
        return [dict(m) for m in messages]
    out = [dict(m) for m in messages]
    block = f"{SKILLS_HEADER}\n{skills_text.strip()}"
    if place == "system":
        out[0]["content"] = f"{out[0]['content']}\n{block}"
    else:
        out[-1]["content"] = f"{block}\n{out[-1]['content']}"
    return out


def parse_action(text: str, finished: bool) -> tuple[str, bool]:
    """(action, format_ok). A response is well formed when generation ended on its own (``finished``) and the
    text is one short command; a malformed response is not sent to the environment."""
    action = " ".join(text.strip().lower().split())
    ok = finished and bool(_ACTION_RE.match(action)) and len(action.split()) <= MAX_ACTION_WORDS
    return action, ok


def dumps(messages: list[dict]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def loads(text: str) -> list[dict]:
    return json.loads(text)
