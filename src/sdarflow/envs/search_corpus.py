"""The synthetic knowledge base behind ``search-qa`` and an Okapi BM25 index over it.

:func:`build_world` generates invented people, companies, cities and countries with relations between them from a
seed (no downloads, no real-world facts a pretrained model could recall instead of searching), and renders one short
document per entity. :class:`BM25` is a plain in-memory Okapi BM25 (Robertson et al.; k1 = 1.5, b = 0.75).
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field

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


def build_world(seed: int, sizes: dict[str, int] | None = None) -> dict[str, Entity]:
    """Entities by id (``person-0``, ``company-3``, ...) with unique names and every relation of their kind."""
    rng = random.Random(seed)
    sizes = {**KIND_SIZES, **(sizes or {})}
    used: set[str] = set()
    names: dict[str, str] = {}
    for kind, n in sizes.items():
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
            target = rng.randrange(sizes[obj])
            if obj == kind and target == int(index):  # nobody mentors themselves
                target = (target + 1) % sizes[obj]
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
