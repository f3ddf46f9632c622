"""Compose the simulated engine's answers from what it knows (``knowledge.json``).

The simulated engine has no model weights. It recognises AI concepts mentioned in a prompt
(batching, the KV cache, RAG, quantization, ...) and composes a short answer from the curated
sentences of the knowledge file. The output is deterministic for a given ``(prompt, seed)``:
all randomness comes from ``random.Random(f"{seed}:{prompt}")``, whose string seeding is stable
across processes (unlike the salted ``hash()``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from itertools import combinations

__all__ = ["CONCEPT_NAMES", "compose_answer", "knowledge_texts", "matched_concepts"]

MIN_WORDS = 40
MAX_WORDS = 160
MAX_DISCUSSED = 3


def _word_regex(patterns: list[str]) -> re.Pattern[str]:
    return re.compile(rf"\b(?:{'|'.join(patterns)})\b", re.IGNORECASE)


@dataclass(frozen=True)
class _Concept:
    """One AI concept: how to spot it and what to say about it."""

    name: str
    label: str
    regex: re.Pattern[str]
    leads: tuple[str, ...]
    details: tuple[str, ...]


_KNOWLEDGE_FILE = resources.files(__package__).joinpath("knowledge.json")
_DATA: dict = json.loads(_KNOWLEDGE_FILE.read_text(encoding="utf-8"))
_CONCEPTS: tuple[_Concept, ...] = tuple(
    _Concept(c["name"], c["label"], _word_regex(c["patterns"]), (*c["leads"],), (*c["details"],))
    for c in _DATA["concepts"]
)
_LINKS: dict[frozenset[str], str] = {frozenset(ln["pair"]): ln["text"] for ln in _DATA["links"]}
_FORMS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (form["form"], _word_regex(form["patterns"])) for form in _DATA["question_forms"]
)
_FALLBACK: dict = _DATA["fallback"]

CONCEPT_NAMES: tuple[str, ...] = tuple(concept.name for concept in _CONCEPTS)
"""Every concept name that :func:`matched_concepts` can return."""


def knowledge_texts() -> Iterator[str]:
    """Every text an answer is made of (the simulated tokenizer builds its vocabulary from them)."""
    return _texts(_DATA)


def _texts(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _texts(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key not in ("about", "name", "pair", "form", "patterns"):  # not said in answers
                yield from _texts(value)


def _find(prompt: str) -> list[_Concept]:
    """Concepts in ``prompt`` ordered by first appearance.

    All pattern matches are collected, then claimed greedily from left to right with longer
    matches winning at the same position, so that for example "tokens per second" counts as
    latency rather than tokenization.
    """
    hits: list[tuple[int, int, int]] = []
    for index, concept in enumerate(_CONCEPTS):
        for match in concept.regex.finditer(prompt):
            hits.append((match.start(), -(match.end() - match.start()), index))
    hits.sort()

    found: list[_Concept] = []
    claimed_until = -1
    for start, neg_length, index in hits:
        if start < claimed_until:
            continue
        claimed_until = start - neg_length
        concept = _CONCEPTS[index]
        if concept not in found:
            found.append(concept)
    return found


def matched_concepts(prompt: str) -> list[str]:
    """Return the names of the AI concepts mentioned in ``prompt``.

    Matching is case-insensitive and word-boundary aware; names are listed in order of first
    appearance and each appears once.
    """
    return [concept.name for concept in _find(prompt)]


def _question_form(prompt: str) -> str:
    for form, pattern in _FORMS:
        if pattern.search(prompt):
            return form
    return "general"


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    if len(items) == 2:
        return f"{items[0]} and {items[1]}"
    return f"{', '.join(items[:-1])}, and {items[-1]}"


def _join_or(items: list[str]) -> str:
    return " or ".join(items) if len(items) <= 2 else f"{', '.join(items[:-1])}, or {items[-1]}"


def _fallback(rng: random.Random) -> str:
    opening = rng.choice(_FALLBACK["openings"])
    lead = rng.choice(_FALLBACK["leads"])
    facts = rng.sample(_FALLBACK["facts"], 2)
    topics = [concept.label for concept in rng.sample(_CONCEPTS, 3)]
    invite = _FALLBACK["invite"].format(topics=_join_or(topics))
    return " ".join([opening, lead, *facts]) + "\n\n" + invite


def _link(concepts: list[_Concept], generic_template: str) -> str:
    for first, second in combinations(concepts, 2):
        text = _LINKS.get(frozenset((first.name, second.name)))
        if text is not None:
            return text
    return generic_template.format(pair=_join([concepts[0].label, concepts[1].label]))


@dataclass
class _Draft:
    """Every choice behind one answer, so it can be re-rendered while trimming."""

    found: list[_Concept]
    form: str
    opening_index: int
    orders: list[list[str]]  # per concept: lead sentence, then shuffled details
    initial_counts: list[int]
    generic_link: str
    closing: str
    counts: list[int] = field(default_factory=list)
    shown: int = 0
    use_link: bool = True
    use_closing: bool = True

    def reset(self, shown: int) -> None:
        """Discuss the first ``shown`` concepts with their initial sentence counts."""
        self.shown = shown
        self.counts = self.initial_counts[:shown]
        self.use_link = True
        self.use_closing = True

    def render(self) -> str:
        concepts = self.found[: self.shown]
        rest = self.found[self.shown :]
        openings = _DATA["openings"][self.form]
        templates = openings["one"] if len(concepts) == 1 else openings["several"]
        template = templates[self.opening_index % len(templates)]
        body = [template.format(t=_join([concept.label for concept in concepts]))]
        for order, count in zip(self.orders[: self.shown], self.counts, strict=True):
            body.extend(order[:count])

        tail: list[str] = []
        if self.use_link and len(concepts) > 1:
            tail.append(_link(concepts, self.generic_link))
        if self.use_closing:
            if rest:
                labels = _join([concept.label for concept in rest[:3]])
                tail.append(_DATA["rest_closing"].format(rest=labels))
            else:
                tail.append(self.closing)
        text = " ".join(body)
        if not tail:
            return text
        separator = "\n\n" if len(concepts) > 1 else " "
        return text + separator + " ".join(tail)

    def shrink(self) -> bool:
        """Make the answer one step shorter; return False when nothing is left to cut."""
        longest = max(range(self.shown), key=lambda i: (self.counts[i], i))
        if self.counts[longest] > 2:
            self.counts[longest] -= 1
        elif self.shown > 2:
            # A linked pair plus a pointer to the rest reads better than three
            # bare concepts, so give up the last concept before the tail.
            self.reset(self.shown - 1)
        elif self.use_closing:
            self.use_closing = False
        elif self.use_link and self.shown > 1:
            self.use_link = False
        elif self.shown > 1:
            self.reset(self.shown - 1)
        else:
            return False
        return True

    def grow(self) -> bool:
        """Add one more detail sentence; return False when none is left."""
        for index, order in enumerate(self.orders[: self.shown]):
            if self.counts[index] < len(order):
                self.counts[index] += 1
                return True
        return False


def compose_answer(prompt: str, seed: int) -> str:
    """Compose a deterministic answer to ``prompt`` for the given ``seed``.

    The answer opens with a sentence suited to the question form (what, why, how, compare,
    explain), then gives two to four sentences for each recognised concept, a linking sentence
    when several concepts are discussed, and a closing sentence (which points to any concepts
    left out for length). Prompts without a known concept get a general answer about language
    models that invites known topics. Answers stay between 40 and 160 words.
    """
    rng = random.Random(f"{seed}:{prompt}")
    found = _find(prompt)
    if not found:
        return _fallback(rng)

    # Draw every random choice up front so trimming never changes the stream.
    discussed = found[:MAX_DISCUSSED]
    opening_index = rng.randrange(6)
    low, high = {1: (3, 4), 2: (2, 3)}.get(len(discussed), (2, 2))
    orders: list[list[str]] = []
    counts: list[int] = []
    for concept in discussed:
        counts.append(rng.randint(low, high))
        lead = rng.choice(concept.leads)
        orders.append([lead, *rng.sample(concept.details, len(concept.details))])
    draft = _Draft(
        found=found,
        form=_question_form(prompt),
        opening_index=opening_index,
        orders=orders,
        initial_counts=counts,
        generic_link=rng.choice(_DATA["generic_links"]),
        closing=rng.choice(_DATA["closings"]),
    )
    draft.reset(len(discussed))

    text = draft.render()
    while len(text.split()) > MAX_WORDS and draft.shrink():
        text = draft.render()
    while len(text.split()) < MIN_WORDS and draft.grow():
        text = draft.render()
    return text
