"""How an agent turn is put to the policy (chat messages from the task, the recent actions and the observation),
where the teacher's privileged skills go, and how a sampled response becomes an action. Rollouts, SFT and the
teacher all call these functions, so the student and teacher contexts differ only by the inserted skills.

Skill places (``teacher_prompt_ids``):

``prefix``  the SDAR reference (``build_teacher_batch`` in ZJU-REAL/SDAR ``verl/trainer/ppo/rlsd_ray_trainer.py``):
            the student prompt's ids decoded with special tokens, ``PRIVILEGED_TEMPLATE`` put in front, re-tokenized
            without added special tokens and left-truncated to ``max_tokens``: the skills sit outside any message.
``system``  a ``Skills:`` block appended to the system message, then the chat template.
``user``    a ``Skills:`` block put before the last user message's content, then the chat template.

Prompt formats (``PROMPT_FORMATS``):

``command``    a system prompt asking for one command; the reply is the action itself (what the models sdarflow
               builds, ``sdarflow.models.tiny``, are trained on).
``reference``  the SDAR reference's agent prompt (``ALFWORLD_TEMPLATE`` in ZJU-REAL/SDAR
               ``agent_system/environments/prompts/alfworld.py``): one user message with the task, the step count,
               the recent actions, the observation and the env's admissible actions where it lists them; the reply
               reasons in ``<think> </think>`` and gives the action in ``<action> </action>`` (``parse_reference``).
               Differences: the history holds actions only (the reference also quotes past observations), and the
               action inside the tag then goes through the env's own parser, so tool calls keep their syntax.
"""

from __future__ import annotations

import json
import re
from typing import Literal

SYSTEM_PROMPT = "You are an agent in a text game. Reply with exactly one command."
PROMPT_FORMATS: tuple[str, ...] = ("command", "reference")
REFERENCE_TASK = "You are an expert agent operating in a text environment. Your task is to: "
REFERENCE_STEPS = "\nPrior to this step, you have already taken "
REFERENCE_ASK = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
    "within <action> </action> tags."
)
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")  # the reference's projection rejects replies with Chinese characters
SKILLS_HEADER = "Skills:"
SkillPlace = Literal["prefix", "system", "user"]
SKILL_PLACES: tuple[str, ...] = ("prefix", "system", "user")
# The reference teacher prompt (build_teacher_batch): f"[Privileged Skill Information]\n{skill_text}\n\n" + prompt.
PRIVILEGED_TEMPLATE = "[Privileged Skill Information]\n{skills}\n\n{prompt}"

# A command is a short lower-case phrase: what text games and simple tool calls accept.
_ACTION_RE = re.compile(r"^[a-z0-9][a-z0-9 '\-]{0,63}$")
MAX_ACTION_WORDS = 8


def build_messages(
    instruction: str,
    actions: list[str],
    observation: str,
    history_turns: int = 4,
    prompt_format: str = "command",
    admissible: list[str] | tuple[str, ...] | None = None,
) -> list[dict]:
    """Student context in ``prompt_format`` (module doc): the goal, the last ``history_turns`` actions and the
    observation (and in ``reference`` the ``admissible`` actions when the env gave them)."""
    recent = actions[-history_turns:] if history_turns > 0 else []
    if prompt_format == "reference":
        listed = "\n ".join(f"'{a}'" for a in admissible or ())
        user = (
            f"{REFERENCE_TASK}{instruction}{REFERENCE_STEPS}{len(actions)} step(s). Below are the most recent "
            f"{len(recent)} actions you took: {'; '.join(recent) or 'none'}\n"
            f"You are now at step {len(actions) + 1} and your current observation is: {observation}\n"
            + (f"Your admissible actions of the current situation are: [{listed}].\n" if listed else "")
            + f"\n{REFERENCE_ASK}"
        )
        return [{"role": "user", "content": user}]
    history = "; ".join(recent) if recent else "none"
    user = f"Goal: {instruction}\nRecent actions: {history}\nObservation: {observation}\nCommand?"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def goal_of(messages: list[dict]) -> str:
    """The instruction ``build_messages`` put in the user message ("" for messages it did not build)."""
    user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    for start, end in (("Goal: ", "\nRecent actions: "), (REFERENCE_TASK, REFERENCE_STEPS)):
        if user.startswith(start) and end in user:
            return user[len(start) : user.index(end)]
    return ""


def format_of(messages: list[dict]) -> str:
    """The prompt format ``build_messages`` built ``messages`` in (``command`` for messages it did not build)."""
    user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    return "reference" if user.startswith(REFERENCE_TASK) else "command"


def insert_skills(messages: list[dict], skills_text: str, place: SkillPlace = "system") -> list[dict]:
    """The messages with ``skills_text`` added to the system or the last user message (``prefix`` works on token
    ids: ``teacher_prompt_ids``)."""
    if place not in ("system", "user"):
        raise ValueError(
            f"insert_skills puts skills in a message (system or user), not {place!r}; fix: use teacher_prompt_ids"
        )
    out = [dict(m) for m in messages]
    if not skills_text:
        return out
    block = f"{SKILLS_HEADER}\n{skills_text.strip()}"
    if place == "system" and out[0].get("role") != "system":  # the reference format has no system message
        out.insert(0, {"role": "system", "content": block})
    elif place == "system":
        out[0]["content"] = f"{out[0]['content']}\n{block}"
    else:
        out[-1]["content"] = f"{block}\n{out[-1]['content']}"
    return out


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through the chat template, ending with the assistant's turn opener."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_text(tokenizer, prompt_ids: list[int]) -> str:
    """The rendered student prompt as ``build_teacher_batch`` reads it (special tokens kept); keyword retrieval
    matches this text too."""
    return tokenizer.decode(list(prompt_ids), skip_special_tokens=False)


def teacher_prompt_ids(
    tokenizer,
    student_ids: list[int],
    messages: list[dict],
    skills_text: str,
    place: SkillPlace = "prefix",
    max_tokens: int | None = None,
    student_text: str | None = None,
) -> list[int]:
    """The student's context with ``skills_text`` at ``place`` (module doc), left-truncated to ``max_tokens``
    (the reference's ``data.max_prompt_length``; None keeps all). ``prefix`` reads ``student_ids`` (or their decoded
    ``student_text``), ``system`` and ``user`` re-render ``messages``. Without skill text ``student_ids`` come back
    unchanged, so the teacher-equals-student guard can count such rows."""
    if not skills_text:
        return list(student_ids)
    if place == "prefix":
        text = student_text if student_text is not None else prompt_text(tokenizer, student_ids)
        full = PRIVILEGED_TEMPLATE.format(skills=skills_text, prompt=text)
        ids = tokenizer.encode(full, add_special_tokens=False)
    else:
        ids = encode_prompt(tokenizer, insert_skills(messages, skills_text, place))
    return ids[-max_tokens:] if max_tokens is not None and len(ids) > max_tokens else ids


def parse_action(text: str, finished: bool) -> tuple[str, bool]:
    """(action, format_ok). A response is well formed when generation ended on its own (``finished``) and the
    text is one short command; a malformed response is not sent to the environment."""
    action = " ".join(text.strip().lower().split())
    ok = finished and bool(_ACTION_RE.match(action)) and len(action.split()) <= MAX_ACTION_WORDS
    return action, ok


def parse_reference(text: str, finished: bool, inner=parse_action) -> tuple[str, bool]:
    """(action, format_ok) of a ``reference``-format reply, as ``alfworld_projection`` (ZJU-REAL/SDAR
    ``agent_system/environments/env_package/alfworld/projection.py``) reads it: the text between the first
    ``<action>`` and ``</action>`` (any case), well formed only with ``<think>`` and ``</think>`` and no Chinese
    character. The closing tag shows the action is complete, so ``finished`` is not needed; the action then goes
    through the env's parser ``inner``, which may refuse it."""
    lower = text.lower()
    start, end = lower.find("<action>"), lower.find("</action>")
    if start == -1 or end < start or not ("<think>" in lower and "</think>" in lower) or _CJK_RE.search(text):
        return "", False
    return inner(text[start + len("<action>") : end].strip(), True)


def action_of(response: str, messages: list[dict]) -> str:
    """The action of a well-formed ``response`` to ``messages``, lower-cased and whitespace-normalized: the reply
    itself in the command format, the text inside its ``<action>`` tag in the reference format."""
    if format_of(messages) == "reference":
        response = parse_reference(response, True, inner=lambda action, _: (action, True))[0]
    return " ".join(response.lower().split())


def format_response(action: str, prompt_format: str, thought: str = "") -> str:
    """The well-formed reply carrying ``action`` in ``prompt_format``: what SFT and format repair teach."""
    if prompt_format == "reference":
        return f"<think>{thought}</think>\n<action>{action}</action>"
    return action


def dumps(messages: list[dict]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def loads(text: str) -> list[dict]:
    return json.loads(text)
