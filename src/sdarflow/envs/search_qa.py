"""The ``search-qa`` env suite: multi-hop questions over a generated corpus, answered with a BM25 search tool.

Actions are ``search[query]`` (the observation is the best ``top_k`` documents) and ``answer[text]`` (ends the
episode; reward 1.0 on an exact, case- and space-insensitive match). Questions follow relation paths from a person
(:data:`TEMPLATES`); each hop's answer is only in the previous hop's document, so an n-hop question needs n
searches. ``train``/``test`` use the same templates on disjoint people; ``ood`` has a 3-hop template and the
``mentor`` relation, which is in the corpus but in no train question.

The corpus: :func:`build_world` generates invented people, companies, cities and countries with relations between
them from a seed (no downloads, no real-world facts a pretrained model could recall instead of searching), and
renders one short document per entity. :class:`BM25` is a plain in-memory Okapi BM25 (Robertson et al.; k1 = 1.5,
b = 0.75).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field

from sdarflow.envs.base import (
    EnvError,
    Reset,
    SkillTruth,
    Step,
    Task,
    check_max_turns,
    check_step,
    split_spec,
    task_indices,
    task_number,
)

# relation -> (subject kind, object kind, sentence). Every relation is stated in the subject's document only, so
# a multi-hop question needs one search per hop.
RELATIONS: dict[str, tuple[str, str, str]] = {
    "born_in": ("person", "city", "{s} was born in {o}."),
    "works_for": ("person", "company", "{s} works for {o}."),
    "mentor": ("person", "person", "The mentor of {s} is {o}."),
    "based_in": ("company", "city", "{s} is based in {o}."),
    "in_country": ("city", "country", "{s} is a city in {o}."),
}
KIND_SIZES: dict[str, int] = {"person": 240, "company": 40, "city": 30, "country": 8}

_SYLLABLES = (
    "ka", "lo", "mi", "ren", "tas", "vo", "dri", "sel", "nor", "pa", "zu", "el", "qui", "bar", "tin", "os", "fen",
    "ga", "hul", "ri", "mar", "dov", "ek", "sa", "lun", "tor", "bel", "fi", "gor", "ny",
)  # fmt: skip
_SUFFIX = {"company": ("corp", "labs", "works", "group"), "country": ("ia", "land", "stan", "mark")}
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Entity:
    """One entity: ``facts`` maps a relation name to the target entity id."""

    eid: str
    kind: str
    name: str
    facts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Document:
    doc_id: str  # the entity id it describes
    title: str
    text: str


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(n)).capitalize()


def _name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{_word(rng, 2)} {_word(rng, rng.randint(2, 3))}"
    if kind == "company":
        return f"{_word(rng, 2)} {rng.choice(_SUFFIX['company']).capitalize()}"
    if kind == "country":
        return _word(rng, 2) + rng.choice(_SUFFIX["country"])
    return _word(rng, 3)


def build_world(seed: int) -> dict[str, Entity]:
    """Entities by id (``person-0``, ``company-3``, ...) with unique names and every relation of their kind."""
    rng = random.Random(seed)
    used: set[str] = set()
    names: dict[str, str] = {}
    for kind, n in KIND_SIZES.items():
        for i in range(n):
            name = _name(rng, kind)
            while name.lower() in used:  # names are answers: they must be unique, case-insensitively
                name = _name(rng, kind)
            used.add(name.lower())
            names[f"{kind}-{i}"] = name
    world: dict[str, Entity] = {}
    for eid, name in names.items():
        kind, _, index = eid.partition("-")
        facts = {}
        for rel, (subj, obj, _) in RELATIONS.items():
            if subj != kind:
                continue
            target = rng.randrange(KIND_SIZES[obj])
            if obj == kind and target == int(index):  # nobody mentors themselves
                target = (target + 1) % KIND_SIZES[obj]
            facts[rel] = f"{obj}-{target}"
        world[eid] = Entity(eid, kind, name, facts)
    return world


def documents(world: dict[str, Entity]) -> list[Document]:
    """One document per entity: its kind, then one sentence per relation it is the subject of."""
    docs = []
    for ent in world.values():
        sentences = [f"{ent.name} is a {ent.kind}."]
        sentences += [
            RELATIONS[rel][2].format(s=ent.name, o=world[target].name) for rel, target in ent.facts.items()
        ]
        docs.append(Document(ent.eid, ent.name, " ".join(sentences)))
    return docs


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class BM25:
    """Okapi BM25 over a fixed list of documents; read-only after construction (safe to share across threads)."""

    def __init__(self, docs: list[Document], k1: float = 1.5, b: float = 0.75) -> None:
        self.docs, self.k1, self.b = docs, k1, b
        self.tf = [Counter(tokenize(f"{d.title} {d.text}")) for d in docs]
        self.lengths = [sum(tf.values()) for tf in self.tf]
        self.avg_len = sum(self.lengths) / max(1, len(docs))
        df = Counter(term for tf in self.tf for term in tf)
        n = len(docs)
        # The "+1" form of IDF stays positive for terms in most documents (e.g. "is"), unlike the original.
        self.idf = {term: math.log(1 + (n - f + 0.5) / (f + 0.5)) for term, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = [t for t in tokenize(query) if t in self.idf]
        out = []
        for tf, length in zip(self.tf, self.lengths):
            norm = self.k1 * (1 - self.b + self.b * length / self.avg_len)
            out.append(sum(self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in terms if t in tf))
        return out

    def search(self, query: str, k: int) -> list[Document]:
        """The ``k`` best documents with a positive score, best first (ties broken by corpus order)."""
        scored = [(s, i) for i, s in enumerate(self.scores(query)) if s > 0]
        scored.sort(key=lambda si: (-si[0], si[1]))
        return [self.docs[i] for _, i in scored[:k]]


@dataclass(frozen=True)
class Template:
    task_type: str
    path: tuple[str, ...]  # relations followed from the subject person
    question: str  # {s} = the subject's name


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "in-distribution": (
        Template("birthplace", ("born_in",), "Where was {s} born?"),
        Template("employer", ("works_for",), "Which company does {s} work for?"),
        Template(
            "employer-city", ("works_for", "based_in"), "In which city is the company {s} works for based?"
        ),
        Template("birth-country", ("born_in", "in_country"), "In which country was {s} born?"),
    ),
    "ood": (
        Template(
            "employer-country",
            ("works_for", "based_in", "in_country"),
            "In which country is the company {s} works for based?",
        ),
        Template("mentor-city", ("mentor", "born_in"), "Where was the mentor of {s} born?"),
        Template(
            "mentor-employer", ("mentor", "works_for"), "Which company does the mentor of {s} work for?"
        ),
    ),
}


@dataclass(frozen=True)
class QASplit:
    """Question templates and the share of people [lo, hi) whose questions the split asks, plus its turn limit."""

    templates: tuple[Template, ...]
    people: tuple[float, float]
    max_turns: int = 6


QA_SPLITS: dict[str, QASplit] = {
    "train": QASplit(TEMPLATES["in-distribution"], (0.0, 0.5)),
    "valid": QASplit(TEMPLATES["in-distribution"], (0.5, 0.6)),
    "test": QASplit(TEMPLATES["in-distribution"], (0.6, 0.8)),
    "ood": QASplit(TEMPLATES["ood"], (0.8, 1.0), max_turns=8),
}

_ACTION = re.compile(r"^(search|answer)\[([^\[\]]{1,80})\]$")
_TASK_ID = re.compile(r"search-qa-(\w+)-(\d+)")
INSTRUCTIONS = "Use search[query] to find documents, then answer[text] with the exact name."


def normalize(text: str) -> str:
    """Lower case, single spaces, no surrounding spaces or final period: how answers are compared."""
    return " ".join(text.lower().split()).rstrip(".").strip()


def parse_qa_action(text: str) -> tuple[str, str] | None:
    """(verb, argument) of ``search[...]``/``answer[...]``, or None when malformed."""
    match = _ACTION.match(normalize(text))
    return (match[1], match[2].strip()) if match else None


def chain_actions(world: dict[str, Entity], chain: list[str]) -> list[str]:
    """The expert's actions for a question's ``chain`` (entity ids, subject first, answer last): search each hop's
    entity in order, then answer with the last one's name."""
    names = [world[eid].name.lower() for eid in chain]
    return [*(f"search[{n}]" for n in names[:-1]), f"answer[{names[-1]}]"]


class SearchQAEnv:
    """One episode: a question, a search tool over the suite's shared (read-only) index, one answer."""

    def __init__(self, task: Task, suite: SearchQASuite, max_turns: int) -> None:
        spec = json.loads(task.payload)
        self.task, self.suite, self.max_turns = task, suite, max_turns
        self.question, self.chain = spec["question"], spec["chain"]  # entity ids, subject first, answer last
        self.answer = suite.world[self.chain[-1]].name
        self.seen: set[str] | None = None

    def reset(self) -> Reset:
        self.seen, self.turns, self.done, self.malformed = set(), 0, False, 0
        return Reset(instruction=f"{self.question}\n{INSTRUCTIONS}", observation="No search yet.")

    def step(self, action: str) -> Step:
        check_step(self.task, self.seen is not None, self.done)
        self.turns += 1
        parsed, won = parse_qa_action(action), False
        if parsed is None:
            self.malformed += 1
            observation = "Unknown action. Use search[query] or answer[text]."
        elif parsed[0] == "search":
            hits = self.suite.index.search(parsed[1], self.suite.top_k)
            self.seen.update(d.doc_id for d in hits)
            observation = "\n".join(f"[{d.title}] {d.text}" for d in hits) or "No results."
        else:
            won, self.done = normalize(parsed[1]) == normalize(self.answer), True
            observation = "Correct." if won else "Wrong answer."
        truncated = not self.done and self.turns >= self.max_turns
        self.done = self.done or truncated
        info = {"turn": self.turns, "malformed_calls": self.malformed, "truncated": truncated}
        return Step(observation, 1.0 if won else 0.0, self.done, won, info)

    def expert_action(self) -> str | None:
        """Search each hop's entity in order until its document has been shown, then answer."""
        if self.seen is None or self.done:
            return None
        steps = chain_actions(self.suite.world, self.chain)
        return next((a for eid, a in zip(self.chain[:-1], steps) if eid not in self.seen), steps[-1])

    def close(self) -> None:
        self.seen = None


class SearchQASuite:
    """The ``search-qa`` suite. world_seed: the generated corpus; top_k: documents per search; max_turns:
    overrides every split's default (train/test 6, ood 8)."""

    name = "search-qa"
    format_hint = "Invalid action. Reply with search[query] or answer[text]."
    max_action_tokens = 32
    thread_safe = True  # episodes share only read-only data

    def __init__(self, world_seed: int = 0, top_k: int = 2, max_turns: int | None = None) -> None:
        check_max_turns(max_turns)
        if top_k < 1:
            raise EnvError(f"top_k must be >= 1, got {top_k}; fix: show at least one document per search")
        self.world_seed, self.top_k, self.max_turns = world_seed, top_k, max_turns
        self.world = build_world(world_seed)
        self.index = BM25(documents(self.world))

    def _spec(self, split: str) -> QASplit:
        return split_spec(QA_SPLITS, split, self.name)

    def _people(self, split: str) -> list[int]:
        """The split's people in a fixed, seeded order (so the first n questions cover many people)."""
        lo, hi = self._spec(split).people
        people = list(range(int(lo * KIND_SIZES["person"]), int(hi * KIND_SIZES["person"])))
        random.Random(f"{self.world_seed}/{split}").shuffle(people)
        return people

    def skill_truth(self) -> SkillTruth:
        """Every question, of every template, is answered by searching, hop by hop, then answering."""
        types = {t.task_type for ts in TEMPLATES.values() for t in ts}
        return SkillTruth(
            calls={t: {"search": 1.0, "answer": 1.0} for t in sorted(types)},
            call_pattern=r"^(search|answer)\[",
        )

    def tasks(self, split: str, n: int | None = None, start: int = 0) -> list[Task]:
        """Question i asks template ``i % T`` about person ``i // T`` of the split's people."""
        spec, people = self._spec(split), self._people(split)
        t = len(spec.templates)
        return [self._task(split, i, spec.templates[i % t], people[i // t])
                for i in task_indices(split, t * len(people), n, start)]  # fmt: skip

    def _task(self, split: str, i: int, template: Template, person: int) -> Task:
        chain = [f"person-{person}"]
        for rel in template.path:
            chain.append(self.world[chain[-1]].facts[rel])
        question = template.question.format(s=self.world[chain[0]].name)
        payload = json.dumps({"question": question, "chain": chain, "world_seed": self.world_seed})
        return Task(f"search-qa-{split}-{i}", template.task_type, split, payload)

    def make(self, task: Task) -> SearchQAEnv:
        seed = json.loads(task.payload).get("world_seed")
        if seed != self.world_seed:  # entity ids would name other entities in another world
            raise EnvError(
                f"task {task.task_id} was made for world_seed={seed}, this suite has {self.world_seed}; "
                f"fix: get tasks from this suite's tasks()"
            )
        return SearchQAEnv(task, self, self.max_turns or self._spec(task.split).max_turns)

    def parse_action(self, text: str, finished: bool) -> tuple[str, bool]:
        """(normalized action, ok): ok needs ``search[...]`` or ``answer[...]`` that ended on its own."""
        parsed = parse_qa_action(text)
        if parsed is None:
            return normalize(text), False
        return f"{parsed[0]}[{parsed[1]}]", finished

    def reference_continuation(self, task_id: str) -> str | None:
        """The action that completes ``task_id``: ``answer[gold]``, as the expert writes it; None for an id that
        is not this suite's (EnvError past its split's end). The perplexity-delta reward scores each turn by how
        much it makes this likelier."""
        match = _TASK_ID.fullmatch(task_id)
        if not match or match[1] not in QA_SPLITS:
            return None
        return self.solution(task_id, match[1])[-1]

    def solution(self, task_id: str, split: str) -> list[str]:
        """The expert's searches hop by hop, then the answer (``Solutions``)."""
        spec = self._spec(split)
        i = task_number(task_id, "search-qa", split, len(spec.templates) * len(self._people(split)))
        return chain_actions(self.world, json.loads(self.tasks(split, n=1, start=i)[0].payload)["chain"])
