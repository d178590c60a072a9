"""LLM-written skills: a chat model reads contrasting successful and failed episodes of one task type and writes
a skill, validated before it may enter the library.

Backends: any OpenAI-compatible server (``POST <base_url>/chat/completions``; the API key is read only from the
environment variable named in the config), or the policy itself through the HF engine. A reply needs at least
``MIN_STEPS`` valid plain-text steps (``parse_reply``); otherwise it is rejected with the reason logged and the task
type keeps its previous skill, so a small model's gibberish never reaches the teacher's context.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Protocol

from sdarflow.errors import SdarflowError
from sdarflow.rollout.prompt import encode_prompt
from sdarflow.skills.extract import (
    MIN_SUPPORT,
    EpisodeActions,
    abstract,
    evidence,
    literal_actions,
    render,
    skill_name,
    unconditional,
)
from sdarflow.skills.library import STEP_RE, Skill, SkillLibrary, normalize_step

log = logging.getLogger(__name__)

MIN_STEPS = 2
MAX_STEPS = 8
_PLAIN = re.compile(r"^[a-z0-9<>' ,.;:()/\-]+$")
SYSTEM = (
    "You write short reusable procedures (skills) for an agent that plays text cooking games by typing one "
    "command per turn."
)


class SkillExtractionError(SdarflowError):
    """The LLM backend could not be reached or answered something that is not a chat completion."""


class ChatBackend(Protocol):
    name: str

    def fits(self, messages: list[dict], max_tokens: int) -> bool: ...

    def complete(self, messages: list[dict], *, max_tokens: int, temperature: float) -> str: ...


class OpenAIChat:
    """``/chat/completions`` of an OpenAI-compatible server (vLLM, llama.cpp, TGI, OpenAI, ...)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        retries: int = 2,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env, self.timeout_s, self.retries = model, api_key_env, timeout_s, retries
        self.name = f"openai:{model}"

    def fits(self, messages: list[dict], max_tokens: int) -> bool:
        return True  # the server enforces its own context; prompts here are a few hundred tokens

    def complete(self, messages: list[dict], *, max_tokens: int, temperature: float) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    raw = resp.read()
                break
            except urllib.error.HTTPError as err:
                if err.code in (401, 403):
                    raise SkillExtractionError(
                        f"LLM endpoint {self.url} refused the request (HTTP {err.code}); fix: put the API key in "
                        f"the environment variable {self.api_key_env} (it is read from there only)"
                    ) from err
                # Rate limits and server errors are transient; anything else will not get better by retrying.
                if err.code not in (429, 500, 502, 503, 504) or attempt == self.retries:
                    detail = err.read()[:200].decode(errors="replace") if err.fp else ""
                    raise SkillExtractionError(
                        f"LLM endpoint {self.url} answered HTTP {err.code} {detail!r}; fix: check --llm-model "
                        f"('{self.model}') and the server's logs"
                    ) from err
            # IncompleteRead: the body ended before its Content-Length (a dropped connection)
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as err:
                if attempt == self.retries:
                    raise SkillExtractionError(
                        f"cannot reach LLM endpoint {self.url}: {getattr(err, 'reason', err)}; fix: check "
                        f"--llm-base-url (e.g. http://host:8000/v1) and that the server is up"
                    ) from err
            time.sleep(0.5 * 2**attempt)
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        # ValueError: not JSON, not UTF-8, or a number too long to convert
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as err:
            raise SkillExtractionError(
                f"LLM endpoint {self.url} answered without choices[0].message.content ({raw[:120]!r}); "
                f"fix: point --llm-base-url at an OpenAI-compatible /v1 API"
            ) from err
        if content is not None and not isinstance(content, str):
            raise SkillExtractionError(
                f"LLM endpoint {self.url} answered a {type(content).__name__} as message content, not text; "
                f"fix: point --llm-base-url at an OpenAI-compatible /v1 chat API"
            )
        return content or ""


class EngineChat:
    """The policy itself as the skill writer, through the HF engine (greedy when temperature is 0)."""

    def __init__(self, policy, seed: int = 0):
        from sdarflow.rollout.hf_engine import HFEngine

        self.engine = HFEngine(policy.model, policy.tokenizer, policy.eos_id, batch_size=1)
        self.tokenizer, self.seed, self.name = policy.tokenizer, seed, f"engine:{policy.path}"
        self.context = int(getattr(policy.model.config, "max_position_embeddings", 0) or 1 << 30)

    def fits(self, messages: list[dict], max_tokens: int) -> bool:
        return len(encode_prompt(self.tokenizer, messages)) + max_tokens <= self.context

    def complete(self, messages: list[dict], *, max_tokens: int, temperature: float) -> str:
        ids = encode_prompt(self.tokenizer, messages)
        sample = self.engine.generate(
            [ids], [self.seed], max_new_tokens=max_tokens, temperature=temperature, top_p=1.0
        )[0]
        return sample.text


def extraction_messages(
    task_type: str, wins: list[EpisodeActions], losses: list[EpisodeActions], max_actions: int = 16
) -> list[dict]:
    """The request: successful and failed action sequences of one task type, and the required reply format."""

    def show(eps: list[EpisodeActions]) -> str:
        # Episodes as ';'-joined lines, not numbered lists, so an echoed prompt cannot pass as a skill.
        lines = [f"Episode {chr(65 + i)}: " + "; ".join(e.actions[:max_actions]) for i, e in enumerate(eps)]
        return "\n".join(lines) or "none"

    user = (
        f"Task type: {task_type}\n\nSuccessful episodes:\n{show(wins)}\n\nFailed episodes:\n{show(losses)}\n\n"
        f"Write one skill for this task type: a first line '# <title>', then {MIN_STEPS} to {MAX_STEPS} numbered "
        "steps ('1. ...'), each a short command pattern. Write <item> for objects that change between games. "
        "Keep what the successful episodes do and the failed ones miss. Reply with the skill only."
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _step_problem(step: str) -> str | None:
    words = step.split()
    if not 2 <= len(words) <= 20:
        return f"{len(words)} words (need 2-20)"
    if not _PLAIN.match(step):
        return "characters outside plain text"
    letters = sum(c.isalpha() for c in step)
    if letters < 0.6 * len(step.replace(" ", "")):
        return "mostly not letters"
    return None


def parse_reply(text: str) -> tuple[str, list[str] | None, str]:
    """(title, steps, reason): steps is None when the reply is rejected, and reason says why."""
    lines = [ln for ln in text.replace("```", "\n").splitlines() if ln.strip()]
    title = next((ln.strip().lstrip("#").strip() for ln in lines if ln.strip().startswith("#")), "")
    raw = [m.group(1) for ln in lines if (m := STEP_RE.match(ln))]
    if not raw:
        return title, None, "no numbered or bulleted steps in the reply"
    steps: list[str] = []
    problems: list[str] = []
    for r in raw:
        step = normalize_step(r)
        problem = _step_problem(step)
        if problem:
            problems.append(f"'{step[:40]}': {problem}")
        elif step not in steps:
            steps.append(step)
    if len(steps) < MIN_STEPS:
        detail = f" (dropped {'; '.join(problems[:2])})" if problems else ""
        return title, None, f"{len(steps)} valid step(s), need >= {MIN_STEPS}{detail}"
    return title, steps[:MAX_STEPS], ""


def _fitting(backend: ChatBackend, task_type, wins, losses, max_tokens) -> list[dict] | None:
    """The largest request (dropping episodes, failures first when they outnumber successes) that fits."""
    wins, losses = list(wins), list(losses)
    while wins:
        messages = extraction_messages(task_type, wins, losses)
        if backend.fits(messages, max_tokens):
            return messages
        if losses and len(losses) >= len(wins):
            losses.pop()
        else:
            wins.pop()
    return None


def llm_extract(
    episodes: list[EpisodeActions],
    backend: ChatBackend,
    *,
    min_support: int = MIN_SUPPORT,
    per_side: int = 3,
    max_tokens: int = 256,
    temperature: float = 0.0,
    follow_share: float = 0.5,
    round_: int | None = None,
) -> tuple[SkillLibrary, dict[str, str]]:
    """One LLM-written skill per task type with >= ``min_support`` solved tasks; returns (skills, rejected
    reasons). The same bar as the rule extractor: steps the successes show to depend on the goal
    (``extract.unconditional``) are dropped, and the skills merge under the same test
    (``sdarflow.skills.merge``)."""
    literal = literal_actions(episodes)
    by_type: dict[str, list[EpisodeActions]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e)
    lib, rejected = SkillLibrary(), {}
    for task_type, eps in sorted(by_type.items()):
        # Short successes are the cleanest demonstrations; the order is deterministic for reproducible requests.
        wins = sorted((e for e in eps if e.success), key=lambda e: (len(e.actions), e.task_id, e.actions))
        losses = sorted((e for e in eps if not e.success), key=lambda e: (e.task_id, e.actions))
        if len({e.task_id for e in wins}) < min_support:
            continue
        messages = _fitting(backend, task_type, wins[:per_side], losses[:per_side], max_tokens)
        if messages is None:
            rejected[task_type] = (
                f"the request does not fit {backend.name}'s context with {max_tokens} new tokens"
            )
            log.warning("skills: LLM skill for %s rejected: %s", task_type, rejected[task_type])
            continue
        reply = backend.complete(messages, max_tokens=max_tokens, temperature=temperature)
        _, steps, reason = parse_reply(reply)
        if steps is None:
            rejected[task_type] = reason
            log.warning(
                "skills: LLM skill for %s rejected: %s; reply began %r", task_type, reason, reply[:80]
            )
            continue
        abstracted = {s: abstract(normalize_step(s), literal) for s in steps}
        kept = set(unconditional(list(abstracted.values()), wins, literal))
        steps = [s for s in steps if abstracted[s] in kept]
        if not steps:
            rejected[task_type] = "every step depends on the goal's wording (the successes disagree on it)"
            continue
        origin = {"source": f"llm:{backend.name}", "round": round_}
        ev = {**evidence(steps, eps, literal, follow_share), **origin}
        name = skill_name(task_type)
        # The model's own title is not validated text, so the teacher sees a fixed one.
        text = render(f"Skill for {task_type} tasks", steps)
        # No task_keywords, as extract_skills: retrieval goes by the row's task type.
        lib.skills[name] = Skill(name, text, [task_type], evidence=ev)
        log.info("skills: %s wrote %s (%d steps)", backend.name, name, len(steps))
    return lib, rejected
