"""Tests for the canned knowledge behind the simulated engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_infer.engine import simulated_answers
from jupyter_infer.engine.simulated_answers import (
    CONCEPT_NAMES,
    SAMPLE_PROMPTS,
    compose_answer,
    matched_concepts,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCHING_PROMPT = "How does dynamic batching interact with the KV cache?"


def _words(text: str) -> int:
    return len(text.split())


def test_same_prompt_and_seed_give_same_text() -> None:
    for prompt in [*SAMPLE_PROMPTS[:5], "something unrelated entirely"]:
        for seed in (0, 1, 12345):
            assert compose_answer(prompt, seed) == compose_answer(prompt, seed)


def test_different_seeds_can_change_wording() -> None:
    answers = {compose_answer(BATCHING_PROMPT, seed) for seed in range(6)}
    assert len(answers) >= 2


def test_batching_and_kv_cache_are_detected_in_order() -> None:
    assert matched_concepts(BATCHING_PROMPT) == ["batching", "kv cache"]
    assert matched_concepts("the KV cache, then dynamic batching") == ["kv cache", "batching"]
    for seed in range(10):
        answer = compose_answer(BATCHING_PROMPT, seed).lower()
        assert "batching" in answer
        assert "kv cache" in answer


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("What is Self-Attention?", ["attention"]),
        ("Transformers and attention heads", ["transformer", "attention"]),
        ("key-value cache size", ["kv cache"]),
        ("Build an agentic RAG app", ["agents", "rag"]),
        ("How many tokens per second can I get?", ["latency"]),
        ("Why does the tokenizer split words?", ["tokenization"]),
        ("LoRA or full fine-tuning?", ["fine-tuning"]),
        ("4-bit quantization on a CPU", ["quantization", "gpu"]),
        ("MoE versus dense models", ["mixture of experts"]),
        ("speculative decoding and sampling", ["speculative decoding", "sampling"]),
        ("RLHF with a reward model", ["reinforcement learning"]),
        ("Stable Diffusion in a Jupyter notebook", ["diffusion", "jupyter"]),
        ("pick a vector database for embeddings", ["vector database", "embeddings"]),
        ("context window limits cause hallucinations", ["context window", "hallucination"]),
    ],
)
def test_matched_concepts(prompt: str, expected: list[str]) -> None:
    assert matched_concepts(prompt) == expected


def test_matching_respects_word_boundaries() -> None:
    assert matched_concepts("I dragged a ragged rug across the moebius strip") == []
    assert matched_concepts("The fragrance of the storage unit") == []


def test_each_concept_is_listed_once() -> None:
    assert matched_concepts("batching, batches, batch size, dynamic batching") == ["batching"]


def test_every_concept_lead_names_its_concept() -> None:
    for concept in simulated_answers._CONCEPTS:
        for lead in concept.leads:
            assert concept.name in matched_concepts(lead), (concept.name, lead)


def test_labels_join_cleanly() -> None:
    for concept in simulated_answers._CONCEPTS:
        assert " and " not in concept.label, concept.label


def test_enough_concepts_and_sample_prompts() -> None:
    assert len(CONCEPT_NAMES) >= 20
    assert len(set(CONCEPT_NAMES)) == len(CONCEPT_NAMES)
    assert 20 <= len(SAMPLE_PROMPTS) <= 30
    assert len(set(SAMPLE_PROMPTS)) == len(SAMPLE_PROMPTS)
    recognised = [prompt for prompt in SAMPLE_PROMPTS if matched_concepts(prompt)]
    assert len(recognised) >= len(SAMPLE_PROMPTS) - 2


def test_fallback_for_unrelated_prompt() -> None:
    for prompt in ("What's a good recipe for banana bread?", "", "   "):
        assert matched_concepts(prompt) == []
        answer = compose_answer(prompt, 7)
        assert answer.strip()
        assert 40 <= _words(answer) <= 160
        assert "language model" in answer.lower()


def test_length_bounds_for_sample_prompts() -> None:
    for prompt in SAMPLE_PROMPTS:
        for seed in range(40):
            count = _words(compose_answer(prompt, seed))
            assert 40 <= count <= 160, (prompt, seed, count)


def test_length_bounds_when_many_concepts_are_mentioned() -> None:
    prompt = "Compare " + ", ".join(CONCEPT_NAMES)
    assert matched_concepts(prompt) == list(CONCEPT_NAMES)
    for seed in range(40):
        count = _words(compose_answer(prompt, seed))
        assert 40 <= count <= 160, (seed, count)


def test_plain_prose_shape() -> None:
    for prompt in SAMPLE_PROMPTS:
        for seed in range(5):
            answer = compose_answer(prompt, seed)
            assert answer == answer.strip()
            assert answer.count("\n\n") <= 1
            assert answer.replace("\n\n", " ").count("\n") == 0
            assert not answer.lstrip().startswith("#")
            assert "**" not in answer
            assert answer.endswith((".", "?", "!"))


def test_same_answers_across_processes() -> None:
    cases = [(prompt, seed) for prompt in SAMPLE_PROMPTS[:6] for seed in (0, 3)]
    cases.append(("no known keyword here", 5))
    script = (
        "import json, sys\n"
        "from jupyter_infer.engine.simulated_answers import compose_answer\n"
        "cases = json.loads(sys.stdin.read())\n"
        "sys.stdout.write(json.dumps([compose_answer(p, s) for p, s in cases]))\n"
    )
    expected = [compose_answer(prompt, seed) for prompt, seed in cases]
    for hash_seed in ("0", "4242"):
        env = dict(os.environ)
        env["PYTHONHASHSEED"] = hash_seed
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        result = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps(cases),
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=env,
            timeout=60,
            check=True,
        )
        assert json.loads(result.stdout) == expected
