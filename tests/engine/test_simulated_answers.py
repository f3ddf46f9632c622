"""What the simulated engine answers: on topic, within bounds, the same for the same seed."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_infer.engine.simulated.answers import CONCEPT_NAMES, compose_answer, matched_concepts
from jupyter_infer.values.prompts import SAMPLE_PROMPTS

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "simulated_answers_expected.json").read_text("utf-8"))
BATCHING_PROMPT = "How does dynamic batching interact with the KV cache?"
UNRELATED_PROMPTS = ("What's a good recipe for banana bread?", "", "   ")
INVITATION = "try asking about "


def _words(text: str) -> int:
    return len(text.split())


def test_answers_are_the_ones_recorded_before_the_knowledge_became_data() -> None:
    for case in RECORDED["cases"]:
        assert matched_concepts(case["prompt"]) == case["concepts"], case["prompt"]
        assert compose_answer(case["prompt"], case["seed"]) == case["answer"], case["prompt"]
    sweep = [compose_answer(case["prompt"], seed) for case in RECORDED["cases"] for seed in range(RECORDED["sweep_seeds"])]
    assert hashlib.sha256(json.dumps(sweep).encode()).hexdigest() == RECORDED["sweep_sha256"]


def test_same_prompt_and_seed_give_same_text_whatever_ran_before() -> None:
    """An answer depends on its prompt and seed only: not on the answers composed before it
    (other requests of a batch), nor on the notebook's use of the global ``random``."""
    cases = RECORDED["cases"]
    random.seed(1)
    for case in reversed(cases):  # another order than the recording's, with other calls between
        compose_answer(case["prompt"], case["seed"] + 1)
        random.random()
        assert compose_answer(case["prompt"], case["seed"]) == case["answer"], case["prompt"]
    random.seed(2)
    assert [compose_answer(c["prompt"], c["seed"]) for c in cases] == [c["answer"] for c in cases]


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


@pytest.mark.parametrize("concept", CONCEPT_NAMES)
def test_a_question_about_a_concept_gets_an_answer_about_it(concept: str) -> None:
    for seed in range(8):
        answer = compose_answer(f"Tell me about {concept}.", seed)
        assert concept in matched_concepts(answer), (seed, answer)
        assert INVITATION not in answer


def test_two_topics_are_both_discussed_and_linked() -> None:
    for seed in range(10):
        answer = compose_answer("How do RAG and embeddings work together?", seed)
        first, link = answer.split("\n\n")
        assert {"rag", "embeddings"} <= set(matched_concepts(first)), answer
        assert {"rag", "embeddings"} <= set(matched_concepts(link)), answer


def test_topics_left_out_for_length_are_offered_at_the_end() -> None:
    prompt = "Compare " + ", ".join(CONCEPT_NAMES)
    assert matched_concepts(prompt) == list(CONCEPT_NAMES)
    for seed in range(10):
        answer = compose_answer(prompt, seed)
        offered = matched_concepts(answer[answer.index("I can also cover") :])
        discussed = matched_concepts(answer.split(". ")[0])  # the opening names what it covers
        # The answer covers the first topics asked about and offers the next ones.
        assert discussed == list(CONCEPT_NAMES[: len(discussed)]), answer
        assert offered == list(CONCEPT_NAMES[len(discussed) : len(discussed) + len(offered)]), answer
        assert offered, answer


def test_sample_prompts_get_answers_on_their_topics() -> None:
    assert len(set(SAMPLE_PROMPTS)) == len(SAMPLE_PROMPTS)  # "fill with N samples" varies
    off_topic = []
    for prompt in SAMPLE_PROMPTS:
        answer = compose_answer(prompt, 0)
        if INVITATION in answer:
            off_topic.append(prompt)
        else:
            assert matched_concepts(prompt)[0] in matched_concepts(answer), (prompt, answer)
    assert len(off_topic) <= 2, off_topic


def test_unrelated_prompts_get_background_and_an_invitation_to_known_topics() -> None:
    for prompt in UNRELATED_PROMPTS:
        assert matched_concepts(prompt) == []
        for seed in range(10):
            answer = compose_answer(prompt, seed)
            assert 40 <= _words(answer) <= 160
            assert "language model" in answer.lower()
            invited = answer[answer.index(INVITATION) + len(INVITATION) :]
            # Taking the invitation up gets an answer about a known topic.
            follow_up = compose_answer(f"Tell me about {invited}", seed)
            assert INVITATION not in follow_up
            assert matched_concepts(follow_up), invited


def test_length_bounds_for_sample_prompts() -> None:
    for prompt in SAMPLE_PROMPTS:
        for seed in range(40):
            count = _words(compose_answer(prompt, seed))
            assert 40 <= count <= 160, (prompt, seed, count)


def test_length_bounds_when_many_concepts_are_mentioned() -> None:
    prompt = "Compare " + ", ".join(CONCEPT_NAMES)
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
        "from jupyter_infer.engine.simulated.answers import compose_answer\n"
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
