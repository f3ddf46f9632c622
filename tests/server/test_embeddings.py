"""Embeddings (``infer/v1/embeddings``) through the official openai client: each input an
embedding request that the engine runs in its steps beside the other requests, pooled and
normalized; the causal LM's vectors are its last token's final hidden state, as transformers
computes it alone, whatever the batch around it."""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

pytestmark = pytest.mark.timeout(180)

TEXTS = ["the KV cache stores keys and values", "a tokenizer splits text into tokens",
         "keys and values of earlier tokens are cached", "gradient descent nudges the weights"]


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture
def infer_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    if getattr(request, "param", None) in ("hf", "encoder", "reranker"):
        fixture = {"hf": "tiny_model_dir", "encoder": "embed_model_dir", "reranker": "rerank_model_dir"}[request.param]
        model: Path = request.getfixturevalue(fixture)
        return {"engine": "hf", "model": str(model), "dtype": "float32", "num_threads": 1, "max_new_tokens": 64}
    return {}


async def test_vectors_are_normalized_and_in_the_inputs_order(client: openai.AsyncOpenAI, http: Any) -> None:
    # The SDK asks for base64 by default and decodes it: our encoding reads back as floats.
    answer = await client.embeddings.create(model="simulated", input=TEXTS)
    vectors = [d.embedding for d in answer.data]
    assert [d.index for d in answer.data] == [0, 1, 2, 3] and answer.model == "simulated"
    assert all(abs(norm(v) - 1) < 1e-5 for v in vectors)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0
    again = await client.embeddings.create(model="simulated", input=TEXTS[2], encoding_format="float")
    assert again.data[0].embedding == pytest.approx(vectors[2], abs=1e-6)  # base64 and float agree
    # Texts about the same thing lie closer than texts about others.
    assert cosine(vectors[0], vectors[2]) > cosine(vectors[0], vectors[3])
    short = await client.embeddings.create(model="simulated", input=TEXTS[0], dimensions=16, encoding_format="float")
    assert len(short.data[0].embedding) == 16 and abs(norm(short.data[0].embedding) - 1) < 1e-5
    raw = (await http.post("embeddings", json={"input": TEXTS[0], "encoding_format": "base64"})).json()
    floats = struct.unpack(f"<{len(vectors[0])}f", base64.b64decode(raw["data"][0]["embedding"]))
    assert list(floats) == pytest.approx(vectors[0], abs=1e-6)


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [1, "a"]}, "input"), ({"input": {"a": 1}}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": 4096}, "dimensions"), ({"input": "x", "model": "gpt-9"}, "model"),
])
async def test_bad_embedding_bodies_are_openai_4xx(http: Any, body: dict[str, Any], param: str) -> None:
    before = (await http.get("models")).status_code
    answer = await http.post("embeddings", json=body)
    assert 400 <= answer.status_code < 500 and before == 200
    assert answer.json()["error"]["param"] == param, answer.json()


@pytest.mark.parametrize("infer_options", ["hf"], indirect=True)
async def test_a_causal_lm_s_vectors_are_its_last_hidden_state_in_any_batch(
    client: openai.AsyncOpenAI, tiny_model_dir: Path
) -> None:
    served = (await client.models.list()).data[0].id
    texts = [TEXTS[0], "short", TEXTS[1] * 3]  # of different lengths: padded in one forward
    batch = await client.embeddings.create(model=served, input=texts, encoding_format="float")
    alone = await client.embeddings.create(model=served, input="short", encoding_format="float")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    body = AutoModel.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for text, data in zip(texts, batch.data, strict=True):
        with torch.inference_mode():
            hidden = body(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1]
        wanted = torch.nn.functional.normalize(hidden, dim=-1).tolist()
        assert data.embedding == pytest.approx(wanted, abs=1e-4), text
    assert alone.data[0].embedding == pytest.approx(batch.data[1].embedding, abs=1e-5)
    ids = tokenizer("short")["input_ids"]
    as_ids = await client.embeddings.create(model=served, input=ids, encoding_format="float")
    assert as_ids.data[0].embedding == pytest.approx(alone.data[0].embedding, abs=1e-5)


@pytest.mark.parametrize("infer_options", ["hf"], indirect=True)
async def test_embeddings_run_beside_a_generation_not_after_it(client: openai.AsyncOpenAI, http: Any) -> None:
    served = (await client.models.list()).data[0].id
    stream = await client.completions.create(model=served, prompt="once upon a time", max_tokens=64,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = stream.__aiter__()
    await chunks.__anext__()  # the generation is decoding
    embedded = await client.embeddings.create(model=served, input=TEXTS, encoding_format="float")
    assert len(embedded.data) == 4
    rest = [chunk async for chunk in chunks]
    assert sum(len(c.choices) for c in rest) > 0
    # One step ran the four embedding prompts beside the generation's row.
    batches = (await http.get("../batches")).json()["batches"]
    assert any(b["size"] == 5 and b["steps"] >= 1 and b["prefill_steps"] >= 1 for b in batches), batches


async def test_embeddings_share_the_queue_with_chat(client: openai.AsyncOpenAI) -> None:
    chat, vectors = await asyncio.gather(
        client.chat.completions.create(model="simulated", messages=[{"role": "user", "content": "hi"}], max_tokens=8),
        client.embeddings.create(model="simulated", input=TEXTS))
    assert chat.choices[0].message.content and len(vectors.data) == 4


@pytest.mark.parametrize("infer_options", ["encoder"], indirect=True)
async def test_an_embedding_checkpoint_pools_as_its_config_says_and_writes_no_answers(
    client: openai.AsyncOpenAI, http: Any, embed_model_dir: Path
) -> None:
    served = (await client.models.list()).data[0].id
    answer = await client.embeddings.create(model=served, input=TEXTS[:2], encoding_format="float")
    tokenizer = AutoTokenizer.from_pretrained(embed_model_dir)
    body = AutoModel.from_pretrained(embed_model_dir, dtype=torch.float32).eval()
    for text, data in zip(TEXTS[:2], answer.data, strict=True):
        with torch.inference_mode():
            hidden = body(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        wanted = torch.nn.functional.normalize(hidden.mean(0), dim=-1).tolist()  # its 1_Pooling: mean
        assert data.embedding == pytest.approx(wanted, abs=1e-4)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        await client.chat.completions.create(model=served, messages=[{"role": "user", "content": "hi"}])
    status = (await http.get("../status")).json()
    assert status["details"]["pooling"] == "mean" and status["details"]["task"] == "embedding"


# -- rerank: the documents ranked by the cosine of their embeddings and the query's --------------------
async def test_rerank_ranks_the_documents_that_share_the_query_s_meaning_first(http: Any) -> None:
    documents = [TEXTS[3], {"text": TEXTS[2]}, TEXTS[1]]
    answer = (await http.post("rerank", json={"model": "simulated", "query": TEXTS[0], "documents": documents,
                                              "top_n": 2})).json()
    results = answer["results"]
    assert [r["index"] for r in results][0] == 1 and len(results) == 2
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert results[0]["document"] == {"text": TEXTS[2]} and answer["usage"]["total_tokens"] > 0
    # llama-server's path too, and without the documents.
    bare = (await http.post("../rerank", json={"query": TEXTS[0], "documents": documents,
                                                "return_documents": False})).json()
    assert [r["index"] for r in bare["results"]] == [r["index"] for r in answer["results"]] + [
        next(i for i in range(3) if i not in {r["index"] for r in results})]
    assert "document" not in bare["results"][0]
    for body, param in (({"query": "", "documents": ["a"]}, "query"), ({"query": "q", "documents": []}, "documents"),
                        ({"query": "q", "documents": [{"txt": "a"}]}, "documents"),
                        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n")):
        refused = await http.post("rerank", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param


@pytest.mark.parametrize("infer_options", ["reranker"], indirect=True)
async def test_a_cross_encoder_scores_the_query_with_each_document(http: Any, rerank_model_dir: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    documents = [TEXTS[3], TEXTS[2], "short", TEXTS[1] * 2]
    answer = (await http.post("rerank", json={"query": TEXTS[0], "documents": documents})).json()
    tokenizer = AutoTokenizer.from_pretrained(rerank_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rerank_model_dir, dtype=torch.float32).eval()
    wanted = []
    for doc in documents:  # as sentence-transformers' CrossEncoder scores a pair: one logit, its sigmoid
        ids = tokenizer(TEXTS[0], doc, return_tensors="pt")["input_ids"]
        sep = (ids[0] == tokenizer.sep_token_id).nonzero()[0, 0]
        types = (torch.arange(ids.shape[1]) > sep).long()[None]
        with torch.inference_mode():
            wanted.append(torch.sigmoid(model(input_ids=ids, token_type_ids=types).logits[0, 0]).item())
    got = {r["index"]: r["relevance_score"] for r in answer["results"]}
    assert [got[i] for i in range(4)] == pytest.approx(wanted, abs=1e-4)
    assert [r["index"] for r in answer["results"]] == sorted(range(4), key=lambda i: -wanted[i])
    refused = await http.post("embeddings", json={"input": "a"})  # a reranker gives no embeddings
    assert refused.status_code == 400 and "reranker" in refused.json()["error"]["message"]
