"""Canned AI knowledge behind the offline *simulated* inference engine.

The simulated engine has no model weights.  Instead it recognises AI concepts
mentioned in a prompt (batching, the KV cache, RAG, quantization, ...) and
composes a short, technically accurate answer from a curated pool of
sentences.  The output is fully deterministic for a given ``(prompt, seed)``
pair: all randomness comes from ``random.Random(f"{seed}:{prompt}")``, whose
string seeding is stable across processes (unlike the salted ``hash()``).

Public API:

* :func:`compose_answer` - build the answer text for a prompt and seed.
* :func:`matched_concepts` - concept names found in a prompt, in order.
* :data:`SAMPLE_PROMPTS` - realistic prompts for demos and load generators.
* :data:`CONCEPT_NAMES` - every concept name the matcher knows.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from itertools import combinations

__all__ = [
    "CONCEPT_NAMES",
    "SAMPLE_PROMPTS",
    "compose_answer",
    "matched_concepts",
]

MIN_WORDS = 40
MAX_WORDS = 160
MAX_DISCUSSED = 3


@dataclass(frozen=True)
class _Concept:
    """One AI concept: how to spot it and what to say about it."""

    name: str
    label: str
    patterns: tuple[str, ...]
    leads: tuple[str, ...]
    details: tuple[str, ...]
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        body = "|".join(self.patterns)
        compiled = re.compile(rf"\b(?:{body})\b", re.IGNORECASE)
        object.__setattr__(self, "regex", compiled)


_CONCEPTS: tuple[_Concept, ...] = (
    _Concept(
        name="batching",
        label="dynamic batching",
        patterns=(
            r"(?:dynamic|continuous|static|in-?flight) batching",
            r"batch(?:es|ing|ed)?",
        ),
        leads=(
            "Dynamic batching groups requests that arrive close together into a "
            "single forward pass, so the GPU processes many sequences at once "
            "instead of one at a time.",
            "Batching means running several requests through the model together, "
            "which turns many small, memory-bound operations into fewer large "
            "matrix multiplications.",
            "With continuous batching, the server adds new requests to the running "
            "batch and removes finished ones after every decoding step, instead of "
            "waiting for the whole batch to complete.",
        ),
        details=(
            "Because token-by-token decoding is limited by memory bandwidth, "
            "reading the weights once for a whole batch raises throughput almost "
            "for free.",
            "The trade-off is latency: waiting a few milliseconds to collect a "
            "fuller batch can delay the first token of each individual request.",
            "Servers cap the batch by a maximum number of sequences or tokens so "
            "that activations and cached keys and values still fit in GPU memory.",
            "Requests of very different lengths make static batches wasteful, "
            "since short sequences sit idle while the longest one finishes.",
            "Well-tuned batching can raise tokens per second several times over "
            "compared with serving one request at a time.",
        ),
    ),
    _Concept(
        name="attention",
        label="attention",
        patterns=(
            r"self[- ]attention",
            r"multi[- ]head attention",
            r"cross[- ]attention",
            r"flash ?attention",
            r"attention heads?",
            r"attention",
        ),
        leads=(
            "Attention lets each token build its representation as a weighted mix "
            "of the other tokens, with the weights computed from query and key "
            "vectors.",
            "Self-attention compares every token's query with every other token's "
            "key, turns the scores into weights with a softmax, and uses them to "
            "average the value vectors.",
        ),
        details=(
            "In a decoder-only language model the attention is causal, so each "
            "position can only look at earlier tokens.",
            "Multi-head attention runs several attention operations in parallel, "
            "so different heads can track different relationships such as syntax "
            "or long-range references.",
            "The cost of standard attention grows quadratically with sequence "
            "length, which is why long inputs are expensive.",
            "Kernels such as FlashAttention compute exactly the same result while "
            "avoiding writing the full score matrix to GPU memory.",
            "Grouped-query attention shares key and value heads across several "
            "query heads to cut memory use during inference.",
            "Scores are divided by the square root of the head dimension before "
            "the softmax to keep them in a numerically stable range.",
        ),
    ),
    _Concept(
        name="transformer",
        label="the transformer architecture",
        patterns=(
            r"transformers?",
            r"encoder[- ]decoder",
            r"decoder[- ]only",
        ),
        leads=(
            "The transformer is a neural network architecture built from stacked "
            "self-attention and feed-forward blocks, joined by residual "
            "connections and layer normalization.",
            "Transformers process every position of a sequence in parallel during "
            "training, which made them far easier to scale than recurrent "
            "networks.",
        ),
        details=(
            "Because attention by itself ignores word order, transformers add "
            "positional information, today often through rotary position "
            "embeddings.",
            "Most modern chat models are decoder-only transformers trained to "
            "predict the next token.",
            "The original 2017 design paired an encoder with a decoder for machine "
            "translation, while models like BERT keep only the encoder.",
            "Most of the parameters in a typical transformer sit in the "
            "feed-forward layers rather than in attention.",
            "Text generation runs the model once per new token, feeding each "
            "output back in as input for the next step.",
        ),
    ),
    _Concept(
        name="kv cache",
        label="the KV cache",
        patterns=(
            r"kv[- ]?cach(?:e|es|ing)",
            r"key[- ]value cach(?:e|es|ing)",
            r"paged ?attention",
            r"prefix cach(?:e|es|ing)",
        ),
        leads=(
            "The KV cache stores the key and value vectors computed for earlier "
            "tokens, so each new decoding step only has to process the newest "
            "token.",
            "Without a KV cache, every new token would require recomputing keys "
            "and values for the whole prefix, wasting most of the work in each "
            "step.",
        ),
        details=(
            "The cache grows linearly with sequence length, batch size, layer "
            "count and key-value head dimension, so long contexts can take "
            "gigabytes of memory.",
            "PagedAttention in vLLM allocates the cache in fixed-size blocks, which "
            "reduces fragmentation and lets more requests share the GPU.",
            "Grouped-query and multi-query attention shrink the cache by sharing "
            "keys and values across attention heads.",
            "The cache itself can be quantized, for example to 8-bit values, to fit "
            "longer contexts or bigger batches.",
            "Prefix caching reuses the stored entries when many requests share the "
            "same system prompt.",
        ),
    ),
    _Concept(
        name="agents",
        label="AI agents",
        patterns=(
            r"agents?",
            r"agentic",
            r"tool (?:use|calling|calls?)",
            r"function calling",
        ),
        leads=(
            "AI agents run a language model in a loop: it picks an action, calls a "
            "tool such as a search API or code interpreter, reads the result, and "
            "plans the next step.",
            "Agents extend a chat model with tools, memory and a goal, letting it "
            "carry out multi-step tasks rather than answer a single prompt.",
        ),
        details=(
            "Tool calls are usually expressed as structured output, such as JSON "
            "naming a function and its arguments, which the host program then "
            "executes.",
            "Because errors compound over many steps, reliable agents need "
            "guardrails, step limits and clear feedback from their tools.",
            "Patterns like ReAct interleave short reasoning traces with actions, so "
            "the model can adjust its plan after each observation.",
            "Evaluating agents is harder than grading single answers, since success "
            "depends on the whole sequence of actions.",
            "Many frameworks give the agent a scratchpad or external memory so it "
            "can track progress beyond what fits in one prompt.",
        ),
    ),
    _Concept(
        name="rag",
        label="retrieval-augmented generation",
        patterns=(
            r"retrieval[- ]augmented generation",
            r"rag",
            r"retrieval",
            r"retriev(?:e|es|ed|er|ers|ing)",
        ),
        leads=(
            "Retrieval-augmented generation (RAG) fetches relevant documents at "
            "query time and places them in the prompt, so the model answers from "
            "supplied evidence rather than memory alone.",
            "In a RAG pipeline, the question is embedded, the closest passages are "
            "retrieved from an index, and the model writes an answer grounded in "
            "those passages.",
        ),
        details=(
            "RAG lets you update what the system knows by re-indexing documents "
            "instead of retraining the model.",
            "Retrieval quality usually limits answer quality, so chunking and "
            "reranking deserve as much care as the choice of model.",
            "Hybrid retrieval, which combines keyword search such as BM25 with "
            "dense vectors, often beats either method alone.",
            "Asking the model to cite the retrieved passages makes its answers much "
            "easier to verify.",
            "Retrieved text uses up prompt tokens, so a pipeline has to balance "
            "recall against prompt length.",
        ),
    ),
    _Concept(
        name="embeddings",
        label="embeddings",
        patterns=(
            r"embeddings?",
            r"embed(?:s|ded)?",
        ),
        leads=(
            "Embeddings are dense vectors that represent text, images or other data "
            "so that similar meanings end up close together in vector space.",
            "An embedding model maps an input to a fixed-length vector, typically "
            "with a few hundred to a few thousand dimensions, that captures its "
            "meaning.",
        ),
        details=(
            "Similarity between embeddings is usually measured with cosine "
            "similarity or a dot product.",
            "Embeddings power semantic search, clustering, recommendations and "
            "the retrieval step of RAG.",
            "Inside a language model, the first layer is also an embedding table "
            "that turns each token ID into a learned vector.",
            "Queries and documents must be embedded with the same model, because "
            "vectors from different models live in incompatible spaces.",
            "Contrastive training pulls the vectors of related pairs together and "
            "pushes unrelated pairs apart.",
        ),
    ),
    _Concept(
        name="tokenization",
        label="tokenization",
        patterns=(
            r"tokeni[sz](?:er|ers|ation|ing|e|ed)",
            r"tokens?",
            r"byte[- ]pair encoding",
            r"bpe",
            r"vocabular(?:y|ies)",
        ),
        leads=(
            "Tokenization splits text into tokens, the sub-word units a language "
            "model actually reads and writes, and maps each one to an integer ID.",
            "A tokenizer breaks text into pieces from a fixed vocabulary, so a "
            "common word may be a single token while a rare word becomes several.",
        ),
        details=(
            "Most modern tokenizers use byte-pair encoding or a similar sub-word "
            "algorithm, with vocabularies of roughly 32,000 to over 200,000 "
            "entries.",
            "In English text, one token averages about three quarters of a word, "
            "or roughly four characters.",
            "Because pricing, context limits and speed are all counted in tokens, "
            "the tokenizer directly affects cost.",
            "Byte-level tokenizers can represent any input, including emoji and "
            "code, without needing an unknown-token symbol.",
            "Tokenization explains some odd model behavior, such as trouble "
            "counting the letters inside a word.",
            "A model must always be paired with the tokenizer it was trained with.",
        ),
    ),
    _Concept(
        name="quantization",
        label="quantization",
        patterns=(
            r"quanti[sz](?:ation|ed|e|ing)",
            r"int[48]",
            r"[48][- ]bit",
            r"gptq",
            r"awq",
            r"gguf",
        ),
        leads=(
            "Quantization stores model weights, and sometimes activations, at lower "
            "precision, such as 8-bit or 4-bit integers instead of 16-bit floats.",
            "Quantization shrinks a model by representing its numbers with fewer "
            "bits, trading a small loss of accuracy for much lower memory use.",
        ),
        details=(
            "A 7-billion-parameter model needs about 14 GB in 16-bit precision but "
            "only around 4 GB with 4-bit weights.",
            "Because decoding is usually memory-bandwidth bound, smaller weights "
            "often make generation faster as well as cheaper.",
            "Methods such as GPTQ and AWQ use a small calibration set to choose "
            "scales that keep the rounding error low.",
            "Quality usually holds up well at 8 bits, while 4-bit and lower "
            "settings need careful methods to avoid noticeable degradation.",
            "Post-training quantization needs no retraining, whereas "
            "quantization-aware training simulates low precision during training "
            "for better accuracy.",
        ),
    ),
    _Concept(
        name="fine-tuning",
        label="fine-tuning",
        patterns=(
            r"fine[- ]?tun(?:e|ed|es|ing)",
            r"instruction[- ]tun(?:ed|ing)",
            r"q?lora",
            r"peft",
        ),
        leads=(
            "Fine-tuning continues training a pretrained model on a smaller, "
            "task-specific dataset so it adopts a particular style, format or "
            "domain.",
            "Fine-tuning adapts an existing model to new data, and "
            "parameter-efficient methods like LoRA do so by training small "
            "low-rank matrices instead of all the weights.",
        ),
        details=(
            "LoRA freezes the original weights and learns a low-rank update, often "
            "cutting the number of trainable parameters by a factor of a hundred "
            "or more.",
            "QLoRA goes further by keeping the frozen base model in 4-bit "
            "precision, making it possible to tune large models on a single GPU.",
            "A few thousand high-quality examples often matter more than a large, noisy dataset.",
            "Fine-tuning works best for teaching behavior and format, while "
            "retrieval is usually the better tool for facts that change often.",
            "A learning rate that is too high can cause catastrophic forgetting, "
            "where the model loses general abilities it had before.",
            "LoRA adapters are small files that can be swapped at serving time, so "
            "one base model can serve many tasks.",
        ),
    ),
    _Concept(
        name="prompt engineering",
        label="prompt engineering",
        patterns=(
            r"prompt engineering",
            r"prompt design",
            r"prompting",
            r"few[- ]shot",
            r"zero[- ]shot",
            r"chain[- ]of[- ]thought",
            r"system prompts?",
        ),
        leads=(
            "Prompt engineering is the practice of wording instructions, context "
            "and examples so that a model reliably produces the output you want.",
            "Good prompt engineering states the task, the audience and the expected "
            "output format explicitly instead of leaving the model to guess.",
        ),
        details=(
            "Few-shot prompting includes a handful of worked examples, which is "
            "often the quickest way to pin down format and tone.",
            "Asking the model to reason step by step, known as chain-of-thought "
            "prompting, tends to help on multi-step problems.",
            "A system prompt sets persistent rules and persona, while the user "
            "message carries the specific request.",
            "Requesting structured output, such as JSON with named fields, makes "
            "responses easier to parse and validate.",
            "Prompts should be tested against a fixed set of examples, since small "
            "wording changes can shift the results.",
        ),
    ),
    _Concept(
        name="hallucination",
        label="hallucination",
        patterns=(
            r"hallucinat\w*",
            r"confabulat\w*",
        ),
        leads=(
            "A hallucination is a fluent, confident answer that is not supported by "
            "the input or by facts, such as an invented citation or statistic.",
            "Hallucination happens because a language model is trained to produce "
            "plausible continuations, not to check whether they are true.",
        ),
        details=(
            "Grounding answers in retrieved documents and asking for citations is "
            "one of the most effective mitigations.",
            "Fabrications are more common for rare facts, precise numbers and "
            "events after the training cutoff.",
            "Lowering the temperature reduces randomness, but it does not by itself "
            "make a model factual.",
            "Allowing the model to say it does not know, and rewarding that during "
            "training, reduces invented answers.",
            "Automated checks, such as verifying quoted sources, catch many errors "
            "before users ever see them.",
        ),
    ),
    _Concept(
        name="sampling",
        label="sampling temperature",
        patterns=(
            r"temperatures?",
            r"nucleus sampling",
            r"top[- ]?p",
            r"top[- ]?k",
            r"greedy decoding",
            r"sampling",
        ),
        leads=(
            "Temperature rescales the model's logits before sampling: values below "
            "1 sharpen the distribution toward likely tokens, and values above 1 "
            "flatten it.",
            "Sampling decides how the next token is picked from the model's "
            "probability distribution, and temperature controls how adventurous "
            "that choice is.",
        ),
        details=(
            "A temperature of zero is normally treated as greedy decoding, which "
            "always picks the most likely token.",
            "Top-p, or nucleus, sampling keeps the smallest set of tokens whose "
            "probabilities add up to p and samples only from those.",
            "Top-k sampling restricts the choice to the k most likely tokens, "
            "cutting off the long tail of unlikely ones.",
            "Low temperatures suit extraction and code, while higher values help "
            "with brainstorming and creative writing.",
            "Fixing the random seed makes sampled outputs reproducible on the same "
            "software and hardware.",
            "Repetition penalties lower the scores of tokens that have already "
            "appeared, which discourages loops.",
        ),
    ),
    _Concept(
        name="latency",
        label="inference speed",
        patterns=(
            r"latenc(?:y|ies)",
            r"throughput",
            r"tokens per second",
            r"tokens/s(?:ec)?",
            r"time to first token",
            r"ttft",
        ),
        leads=(
            "Latency is how long a single request waits, usually split into time to "
            "first token and time per output token, while throughput is how many "
            "tokens the whole system produces per second.",
            "Latency and throughput pull in opposite directions: serving more "
            "requests together raises total tokens per second but can slow each "
            "individual response.",
        ),
        details=(
            "Time to first token is dominated by the prefill pass over the prompt, "
            "while later tokens are limited by memory bandwidth during decoding.",
            "Streaming tokens as they are produced makes responses feel faster even "
            "when total generation time is unchanged.",
            "Service targets are usually set on tail latency, such as the 95th or "
            "99th percentile, rather than on the average.",
            "Quantization, speculative decoding and smarter batching are the usual "
            "levers for improving both numbers.",
            "Long prompts increase prefill time, so trimming unnecessary context is "
            "one of the cheapest wins.",
        ),
    ),
    _Concept(
        name="gpu",
        label="inference hardware",
        patterns=(
            r"gpus?",
            r"cpus?",
            r"tpus?",
            r"cuda",
            r"vram",
        ),
        leads=(
            "GPUs dominate AI workloads because they run thousands of arithmetic "
            "operations in parallel and have far higher memory bandwidth than "
            "CPUs.",
            "For LLM inference, a GPU's memory capacity and bandwidth matter as much "
            "as raw compute, since the weights must fit in memory and be read at "
            "every step.",
        ),
        details=(
            "CPUs can run small or heavily quantized models, but they are usually "
            "much slower at generating tokens.",
            "Model weights need roughly two bytes per parameter in 16-bit "
            "precision, which sets a lower bound on the memory required.",
            "Tensor cores accelerate matrix multiplications in low-precision "
            "formats such as FP16, BF16 and FP8.",
            "Models too large for one device can be split across several with "
            "tensor or pipeline parallelism.",
            "Keeping the hardware busy, through batching and overlapping work, "
            "matters more than peak specifications.",
        ),
    ),
    _Concept(
        name="diffusion",
        label="diffusion models",
        patterns=(
            r"(?:stable |latent )?diffusion(?: models?)?",
            r"denois(?:e|es|ed|ing)",
        ),
        leads=(
            "Diffusion models generate data by learning to reverse a gradual "
            "noising process, starting from random noise and denoising it step by "
            "step.",
            "A diffusion model is trained to predict the noise that was added to an "
            "image, so at generation time it can remove noise iteratively.",
        ),
        details=(
            "Latent diffusion, used by Stable Diffusion, runs the process in a "
            "compressed latent space to save compute.",
            "Text conditioning, often combined with classifier-free guidance, "
            "steers the output toward the prompt.",
            "Generation needs many denoising steps, so faster samplers and "
            "distillation aim to cut the step count.",
            "Newer image generators increasingly use transformer backbones instead "
            "of the classic U-Net.",
            "Diffusion also works for audio and video, not just still images.",
        ),
    ),
    _Concept(
        name="reinforcement learning",
        label="reinforcement learning",
        patterns=(
            r"reinforcement learning",
            r"rlhf",
            r"rlaif",
            r"rl",
            r"dpo",
            r"ppo",
            r"reward models?",
        ),
        leads=(
            "Reinforcement learning trains a policy to choose actions that maximize "
            "a reward signal through trial and error.",
            "RLHF, or reinforcement learning from human feedback, tunes a language "
            "model toward responses that people rate as more helpful and safe.",
        ),
        details=(
            "In RLHF, people compare pairs of responses, a reward model learns "
            "those preferences, and the policy is optimized against it, classically "
            "with PPO.",
            "Direct preference optimization (DPO) skips the separate reward model "
            "and learns from preference pairs with a simple classification-style "
            "loss.",
            "A KL penalty keeps the tuned model close to the original, so it does "
            "not exploit flaws in the reward model.",
            "Reward hacking, where a model scores well without actually improving, "
            "is a central challenge.",
            "Training with verifiable rewards, such as passing unit tests or "
            "matching a math answer, has become a key way to improve reasoning.",
        ),
    ),
    _Concept(
        name="speculative decoding",
        label="speculative decoding",
        patterns=(
            r"speculative (?:decoding|sampling)",
            r"draft models?",
            r"medusa",
        ),
        leads=(
            "Speculative decoding speeds up generation by letting a small draft "
            "model propose several tokens that the large model then verifies in a "
            "single forward pass.",
            "With speculative decoding, cheap guesses for the next few tokens are "
            "checked in parallel by the target model, and every accepted guess "
            "saves a full decoding step.",
        ),
        details=(
            "With the standard acceptance rule, the output distribution is exactly "
            "the same as sampling from the large model alone.",
            "The speedup depends on the acceptance rate, which is highest for "
            "predictable text such as code or boilerplate.",
            "Variants like Medusa and EAGLE attach lightweight prediction heads to "
            "the main model instead of using a separate draft model.",
            "Typical speedups are around two to three times for single requests, "
            "with smaller gains at large batch sizes.",
            "The trick works because decoding is memory bound, so checking several "
            "tokens at once costs little more than generating one.",
        ),
    ),
    _Concept(
        name="mixture of experts",
        label="mixture of experts",
        patterns=(
            r"mixtures?[- ]of[- ]experts",
            r"moe",
            r"expert routing",
        ),
        leads=(
            "A mixture of experts (MoE) layer contains many feed-forward expert "
            "networks and a router that sends each token to only a few of them.",
            "Mixture of experts models grow their total parameter count without a "
            "matching increase in compute, because only a few experts run for "
            "each token.",
        ),
        details=(
            "Mixtral 8x7B, for example, has about 47 billion parameters but uses "
            "only around 13 billion for each token.",
            "All experts still have to sit in memory, so MoE models need more "
            "memory than their per-token compute suggests.",
            "Training adds a load-balancing loss so the router does not send most "
            "tokens to the same few experts.",
            "Expert parallelism spreads the experts across devices, at the cost of "
            "extra communication between them.",
            "An MoE model can approach the quality of a much larger dense model at "
            "a fraction of the compute per token.",
        ),
    ),
    _Concept(
        name="context window",
        label="the context window",
        patterns=(
            r"context (?:window|length|size|limit)s?",
            r"long[- ]context",
        ),
        leads=(
            "The context window is the maximum number of tokens a model can attend "
            "to at once, covering the prompt, the conversation history and the "
            "generated output.",
            "A model's context window is a hard limit on how much text it can "
            "consider in one request, so anything beyond it must be truncated, "
            "summarized or retrieved.",
        ),
        details=(
            "Context windows have grown from a few thousand tokens to hundreds of "
            "thousands in recent models.",
            "Longer inputs cost more, since attention compute and cached keys and "
            "values both grow with sequence length.",
            "Models often use information at the start and end of a long input more "
            "reliably than material in the middle.",
            "Techniques such as RoPE scaling can stretch a model beyond its original "
            "training length, usually with some extra fine-tuning.",
            "A large window is no substitute for good retrieval, because irrelevant "
            "text can distract the model.",
        ),
    ),
    _Concept(
        name="vector database",
        label="vector databases",
        patterns=(
            r"vector (?:databases?|dbs?|stores?|indexes|indices|index|search)",
            r"faiss",
            r"pgvector",
            r"hnsw",
        ),
        leads=(
            "A vector database stores embeddings and finds the ones nearest to a "
            "query vector, which makes it the search layer behind most RAG systems.",
            "Vector databases index high-dimensional embeddings for fast similarity "
            "search, typically returning the top-k closest items in milliseconds.",
        ),
        details=(
            "Most vector databases rely on approximate nearest-neighbor indexes "
            "such as HNSW or IVF, trading a little recall for large speedups.",
            "Metadata filters let you combine semantic similarity with exact "
            "conditions such as date, owner or document type.",
            "Options range from libraries like FAISS to managed services and "
            "database extensions such as pgvector.",
            "Index parameters control the balance between recall, query latency and memory use.",
            "For a few thousand vectors, a brute-force search in memory is often "
            "fast enough without a dedicated database.",
        ),
    ),
    _Concept(
        name="jupyter",
        label="Jupyter notebooks",
        patterns=(
            r"jupyter(?:lab| notebooks?)?",
            r"notebooks?",
            r"ipython",
            r"ipywidgets",
        ),
        leads=(
            "Jupyter notebooks combine live code, output and prose in one document, "
            "which makes them a natural place to experiment with models "
            "interactively.",
            "In a Jupyter notebook, every cell runs in a persistent kernel, so a "
            "model loaded once stays in memory for later cells.",
        ),
        details=(
            "Because the kernel keeps its state, GPU memory stays allocated until "
            "you delete the model or restart the kernel.",
            "Running cells out of order can leave hidden state, so restarting and "
            "running everything top to bottom is a good reproducibility check.",
            "JupyterLab extensions can add panels and widgets, for example to "
            "stream model output or monitor requests.",
            "Notebooks are great for exploration, but long-running services are "
            "usually better placed in separate processes.",
            "Rich outputs let a notebook render tables, plots and formatted text "
            "directly below the code that produced them.",
        ),
    ),
    _Concept(
        name="distillation",
        label="knowledge distillation",
        patterns=(
            r"(?:knowledge )?distill(?:ation|ed|ing)?",
            r"student models?",
            r"teacher models?",
        ),
        leads=(
            "Knowledge distillation trains a smaller student model to imitate a "
            "larger teacher, often by matching the teacher's output probabilities "
            "rather than only the correct labels.",
            "Distillation compresses what a large model has learned into a smaller, "
            "faster one that is cheaper to serve.",
        ),
        details=(
            "The teacher's probabilities carry extra information, such as which "
            "wrong answers it considers nearly right.",
            "Many small open models are trained partly on text or reasoning traces "
            "generated by larger models.",
            "A softmax temperature above 1 is often used to soften the teacher's "
            "distribution, revealing how it ranks the less likely answers.",
            "A distilled model can keep much of the teacher's quality on its target "
            "tasks while running several times faster.",
        ),
    ),
    _Concept(
        name="streaming",
        label="token streaming",
        patterns=(
            r"stream(?:s|ed|ing)? (?:the )?tokens?",
            r"token streaming",
            r"stream(?:s|ed|ing)?",
            r"server[- ]sent events",
            r"sse",
        ),
        leads=(
            "Token streaming sends each token to the client as soon as it is "
            "generated instead of waiting for the complete response.",
            "With streaming, the user starts reading almost immediately, so the "
            "perceived wait shrinks to roughly the time to first token.",
        ),
        details=(
            "Servers typically stream over server-sent events or WebSockets, "
            "sending small chunks of text as they are produced.",
            "Streaming does not reduce the total compute; it only changes when the "
            "output becomes visible.",
            "Clients should handle partial words and multi-byte characters, because "
            "tokens do not always align with character boundaries.",
            "A streamed response can be cancelled early, which frees GPU time once "
            "the user already has what they need.",
        ),
    ),
    _Concept(
        name="pretraining",
        label="pretraining",
        patterns=(
            r"pre[- ]?train(?:ing|ed)?",
            r"next[- ]token prediction",
            r"scaling laws?",
            r"foundation models?",
        ),
        leads=(
            "Pretraining teaches a language model general knowledge and language "
            "skills by having it predict the next token across a very large text "
            "corpus.",
            "During pretraining, a model reads trillions of tokens from web pages, "
            "books and code, learning statistical patterns without task-specific "
            "labels.",
        ),
        details=(
            "Pretraining is by far the most expensive stage, often using thousands "
            "of accelerators for weeks or months.",
            "Scaling laws describe how loss falls predictably as model size, data "
            "and compute grow together.",
            "A pretrained base model continues text well, but it needs instruction "
            "and preference tuning to behave like an assistant.",
            "Data quality, filtering and deduplication have a large effect on the final model.",
        ),
    ),
    _Concept(
        name="gradient descent",
        label="gradient descent",
        patterns=(
            r"(?:stochastic )?gradient descent",
            r"backprop(?:agation)?",
            r"sgd",
        ),
        leads=(
            "Gradient descent trains a neural network by repeatedly nudging every "
            "weight in the direction that lowers the loss, with backpropagation "
            "computing those gradients efficiently.",
            "Backpropagation applies the chain rule layer by layer to find how much "
            "each weight contributed to the error, and gradient descent then "
            "updates the weights accordingly.",
        ),
        details=(
            "In practice, training uses small random mini-batches and adaptive "
            "optimizers such as Adam or AdamW.",
            "The learning rate is usually warmed up and then decayed, since steps "
            "that are too large make training diverge.",
            "Gradient clipping guards against occasional spikes that could destabilize training.",
            "Mixed-precision training computes in 16-bit formats while keeping a "
            "higher-precision master copy of the weights.",
        ),
    ),
)

_BY_NAME: dict[str, _Concept] = {concept.name: concept for concept in _CONCEPTS}

CONCEPT_NAMES: tuple[str, ...] = tuple(concept.name for concept in _CONCEPTS)
"""Every concept name that :func:`matched_concepts` can return."""


def _pair(first: str, second: str) -> frozenset[str]:
    return frozenset((first, second))


_LINKS: dict[frozenset[str], str] = {
    _pair("batching", "kv cache"): (
        "Batching and the KV cache are tightly linked: every sequence in a batch "
        "keeps its own cache, so the GPU memory left for the cache usually decides "
        "how large a batch can grow."
    ),
    _pair("batching", "latency"): (
        "Batch size is the main dial between the two: larger batches raise "
        "throughput, while smaller ones keep each request's latency low."
    ),
    _pair("batching", "gpu"): (
        "Batching is how a server keeps a GPU's parallel hardware busy, since a "
        "single decoding request leaves most of its compute idle."
    ),
    _pair("attention", "transformer"): (
        "Attention is the defining component of the transformer: each layer pairs "
        "a self-attention block with a feed-forward block."
    ),
    _pair("attention", "kv cache"): (
        "The KV cache exists because of attention: each new query must be compared "
        "with the keys and values of every earlier token, so keeping them avoids "
        "recomputation."
    ),
    _pair("kv cache", "context window"): (
        "A longer context window directly means a larger KV cache, which is why "
        "long-context serving is usually limited by memory."
    ),
    _pair("attention", "context window"): (
        "Attention is also why long context windows are expensive, because its "
        "cost grows with the number of tokens being attended to."
    ),
    _pair("rag", "embeddings"): (
        "Embeddings are the glue in RAG: documents and questions are embedded with "
        "the same model, and the nearest vectors are retrieved as context."
    ),
    _pair("rag", "vector database"): (
        "A vector database is the usual retrieval backend for RAG, returning the "
        "passages whose embeddings sit closest to the question."
    ),
    _pair("embeddings", "vector database"): (
        "Embeddings and vector databases work as a pair: the model turns text into "
        "vectors, and the database makes searching millions of them fast."
    ),
    _pair("rag", "hallucination"): (
        "RAG is one of the main defenses against hallucination, because the model "
        "can draw on retrieved evidence instead of relying on memory."
    ),
    _pair("rag", "context window"): (
        "Retrieval and the context window go hand in hand: RAG selects only the "
        "most relevant passages so that they fit within the token budget."
    ),
    _pair("rag", "fine-tuning"): (
        "A common rule of thumb is to use RAG for knowledge that changes and "
        "fine-tuning for behavior, tone and format."
    ),
    _pair("quantization", "gpu"): (
        "Quantization is often what makes a model fit on the GPU you have, since "
        "halving the bits roughly halves the memory needed for the weights."
    ),
    _pair("quantization", "fine-tuning"): (
        "The two combine in QLoRA, which trains LoRA adapters on top of a 4-bit "
        "quantized base model."
    ),
    _pair("quantization", "latency"): (
        "Quantization helps latency because decoding is memory bound, so reading "
        "fewer bytes per weight speeds up every token."
    ),
    _pair("speculative decoding", "latency"): (
        "Speculative decoding mainly targets latency, producing several tokens per "
        "large-model pass whenever the draft guesses well."
    ),
    _pair("sampling", "hallucination"): (
        "Temperature affects hallucination only indirectly: lower values reduce "
        "random detours, but a model that lacks a fact can still state a wrong one "
        "confidently."
    ),
    _pair("prompt engineering", "hallucination"): (
        "Prompts can reduce hallucination by supplying source material and "
        "explicitly allowing the model to say that it does not know."
    ),
    _pair("agents", "rag"): (
        "Agents often use retrieval as one of their tools, deciding when to search "
        "and how to refine the query based on what comes back."
    ),
    _pair("agents", "prompt engineering"): (
        "Much of an agent's reliability comes from prompt design, including clear "
        "tool descriptions and examples of correct tool calls."
    ),
    _pair("reinforcement learning", "fine-tuning"): (
        "RLHF usually follows supervised fine-tuning: the model first learns from "
        "demonstrations and is then refined with preference feedback."
    ),
    _pair("tokenization", "context window"): (
        "The context window is measured in tokens, so the tokenizer determines how "
        "much actual text fits inside it."
    ),
    _pair("diffusion", "transformer"): (
        "The two ideas now overlap, since diffusion transformers replace the U-Net "
        "backbone with transformer blocks."
    ),
    _pair("mixture of experts", "gpu"): (
        "MoE shifts the bottleneck toward memory: every expert must be loaded on "
        "the GPUs even though each token uses only a few of them."
    ),
    _pair("mixture of experts", "transformer"): (
        "In a transformer, MoE usually replaces the feed-forward block, while the "
        "attention layers stay dense."
    ),
    _pair("jupyter", "gpu"): (
        "When you load a model in a notebook, the kernel holds its GPU memory until "
        "the model is deleted or the kernel restarts."
    ),
    _pair("streaming", "latency"): (
        "Streaming is the simplest way to improve perceived latency, because users "
        "see the first token instead of waiting for the last."
    ),
    _pair("distillation", "quantization"): (
        "Distillation and quantization are complementary compression tools: one "
        "shrinks the architecture, the other shrinks the bits per weight."
    ),
    _pair("pretraining", "fine-tuning"): (
        "Fine-tuning builds on pretraining, reusing the broad knowledge of the base "
        "model and adapting it with far less data and compute."
    ),
    _pair("gradient descent", "fine-tuning"): (
        "Fine-tuning uses the same gradient descent machinery as pretraining, just "
        "on a smaller dataset and usually with a lower learning rate."
    ),
    _pair("gradient descent", "pretraining"): (
        "Pretraining is gradient descent at enormous scale, with every batch of "
        "text nudging the weights toward better next-token predictions."
    ),
    _pair("latency", "gpu"): (
        "Both numbers ultimately depend on the GPU's memory bandwidth, which limits "
        "how quickly the weights can be read at each decoding step."
    ),
    _pair("kv cache", "latency"): (
        "The KV cache helps latency by avoiding recomputation, but its memory "
        "footprint caps how many requests can run at once, which limits throughput."
    ),
    _pair("tokenization", "embeddings"): (
        "The two meet at the model's input: each token ID is looked up in an "
        "embedding table to produce the vector the network actually processes."
    ),
}

_GENERIC_LINKS: tuple[str, ...] = (
    "These topics address different problems, but production systems usually have "
    "to tune {pair} together.",
    "It helps to think about {pair} together, since a choice made for one often "
    "shifts the trade-offs of the other.",
    "In real deployments, {pair} tend to appear side by side, so it pays to "
    "understand how they interact.",
)

_OPENINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # form: (templates for one concept, templates for several concepts)
    "what": (
        (
            "Here is a concise explanation of {t}.",
            "In short, here is what you should know about {t}.",
            "Let's start with a clear definition of {t}.",
        ),
        (
            "Here is a concise explanation of {t}, taken one at a time.",
            "Let's define {t} in turn.",
            "In short, here is what you should know about {t}.",
        ),
    ),
    "why": (
        (
            "The short answer lies in the mechanics of {t}.",
            "To see why, it helps to look at the mechanics of {t} first.",
            "The reasons become clear once you look at how {t} fits into the system.",
        ),
        (
            "The short answer lies in the mechanics of {t}.",
            "To see why, it helps to look at {t} one at a time.",
        ),
    ),
    "how": (
        (
            "Let's walk through the mechanics of {t}.",
            "Here is a practical look at the mechanics behind {t}.",
            "It is easiest to understand {t} by looking at what happens inside the system.",
        ),
        (
            "Let's walk through the mechanics of {t}.",
            "Here is a practical look at the mechanics behind {t}.",
        ),
    ),
    "compare": (
        (
            "A fair comparison starts with a clear picture of {t}.",
            "Before weighing the options, it helps to be precise about {t}.",
        ),
        (
            "These ideas solve different problems, so it helps to look at {t} one at a time.",
            "Comparing {t} is easier once each one is clear on its own.",
        ),
    ),
    "explain": (
        (
            "Here is a plain-language explanation of {t}.",
            "Let me explain {t} in practical terms.",
            "Here is an explanation of {t}, focused on what matters in practice.",
        ),
        (
            "Here is a plain-language explanation of {t}.",
            "Let me explain {t} in practical terms, one piece at a time.",
        ),
    ),
    "general": (
        (
            "Here is an overview of {t}.",
            "Here are the key points about {t}.",
            "Here is what matters most about {t} in practice.",
        ),
        (
            "Here is an overview of {t}.",
            "Here are the key points about {t}.",
        ),
    ),
}

_FORM_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "compare",
        re.compile(
            r"\b(?:compare[sd]?|comparing|comparison|versus|vs|differences?"
            r"|differ|differs|better than|pros and cons)\b",
            re.IGNORECASE,
        ),
    ),
    ("why", re.compile(r"\bwhy\b", re.IGNORECASE)),
    ("how", re.compile(r"\bhow\b", re.IGNORECASE)),
    ("what", re.compile(r"\b(?:what|define|definition|meaning)\b", re.IGNORECASE)),
    (
        "explain",
        re.compile(
            r"\b(?:explain\w*|describe\w*|tell me|walk me through|overview)\b",
            re.IGNORECASE,
        ),
    ),
)

_CLOSINGS: tuple[str, ...] = (
    "Happy to go deeper on any of these points with a concrete example.",
    "Let me know if a worked example or some code to try would help.",
    "Feel free to ask a follow-up if you want more detail on any part of this.",
    "I can expand on any of these points if that would be useful.",
)

_REST_CLOSING = "I kept this focused, but I can also cover {rest} if that would help."

_FALLBACK_OPENINGS: tuple[str, ...] = (
    "I don't have a specific answer for that, but here is some general background "
    "on how AI language models work.",
    "That falls outside the topics I know in detail, so here is some general "
    "context on large language models instead.",
    "Here is some general background on language models that may help frame the question.",
)

_FALLBACK_LEADS: tuple[str, ...] = (
    "Large language models are neural networks, usually transformers, trained on "
    "vast amounts of text to predict the next token.",
    "A large language model learns the statistical patterns of language by "
    "predicting the next token across a huge text corpus.",
)

_FALLBACK_FACTS: tuple[str, ...] = (
    "Trained at sufficient scale, such models pick up surprisingly broad abilities "
    "in writing, summarizing, translating and coding.",
    "Language models generate text one token at a time, with each step "
    "conditioned on the prompt and everything produced so far.",
    "What a model knows comes from training data with a cutoff date, so it can be "
    "out of date or confidently wrong.",
    "Modern assistants add instruction tuning and preference training on top of "
    "pretraining so that they follow requests helpfully.",
    "These systems work best as tools whose output you check, not as "
    "unquestionable sources of truth.",
)

_FALLBACK_INVITE = "For a more detailed answer, try asking about {topics}."

SAMPLE_PROMPTS: list[str] = [
    "What is dynamic batching and how does it interact with the KV cache?",
    "Explain self-attention like I'm a new ML engineer.",
    "Why do transformers need positional information?",
    "How does retrieval-augmented generation reduce hallucinations?",
    "Compare LoRA with full fine-tuning for a 7B model.",
    "What are embeddings, and how are they stored in a vector database?",
    "How does quantization to 4-bit affect accuracy and GPU memory?",
    "What temperature should I use for code generation?",
    "Why is time to first token so much higher for long prompts?",
    "How does speculative decoding speed up inference?",
    "Explain mixture of experts models such as Mixtral.",
    "What happens when a conversation exceeds the context window?",
    "How do AI agents decide which tool to call?",
    "What is RLHF and why do chat models use it?",
    "How do diffusion models generate images from pure noise?",
    "Give me some prompt engineering tips for getting reliable JSON output.",
    "Why does the tokenizer split rare words into several tokens?",
    "Can I run a language model on a CPU, or do I really need a GPU?",
    "What is the trade-off between latency and throughput when serving LLMs?",
    "How should I manage GPU memory when loading models in a Jupyter notebook?",
    "What is knowledge distillation and when is it worth doing?",
    "Why stream tokens to the client instead of returning the whole response?",
    "How does pretraining differ from fine-tuning?",
    "Explain gradient descent and backpropagation in simple terms.",
    "Tell me something interesting about large language models.",
]
"""Realistic user prompts for "fill with N samples" and load generators."""


def _find(prompt: str) -> list[_Concept]:
    """Concepts in ``prompt`` ordered by first appearance.

    All pattern matches are collected, then claimed greedily from left to right
    with longer matches winning at the same position, so that for example
    "tokens per second" counts as latency rather than tokenization.
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

    Matching is case-insensitive and word-boundary aware; names are listed in
    order of first appearance and each appears once.
    """
    return [concept.name for concept in _find(prompt)]


def _question_form(prompt: str) -> str:
    for form, pattern in _FORM_PATTERNS:
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
    if len(items) <= 2:
        return " or ".join(items)
    return f"{', '.join(items[:-1])}, or {items[-1]}"


def _word_count(text: str) -> int:
    return len(text.split())


def _fallback(rng: random.Random) -> str:
    opening = rng.choice(_FALLBACK_OPENINGS)
    lead = rng.choice(_FALLBACK_LEADS)
    facts = rng.sample(_FALLBACK_FACTS, 2)
    topics = [concept.label for concept in rng.sample(_CONCEPTS, 3)]
    invite = _FALLBACK_INVITE.format(topics=_join_or(topics))
    return " ".join([opening, lead, *facts]) + "\n\n" + invite


def _link(concepts: list[_Concept], generic_template: str) -> str:
    for first, second in combinations(concepts, 2):
        text = _LINKS.get(_pair(first.name, second.name))
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
        single, multi = _OPENINGS[self.form]
        templates = single if len(concepts) == 1 else multi
        template = templates[self.opening_index % len(templates)]
        opening = template.format(t=_join([concept.label for concept in concepts]))
        body = [opening]
        for order, count in zip(self.orders[: self.shown], self.counts, strict=True):
            body.extend(order[:count])

        tail: list[str] = []
        if self.use_link and len(concepts) > 1:
            tail.append(_link(concepts, self.generic_link))
        if self.use_closing:
            if rest:
                labels = _join([concept.label for concept in rest[:3]])
                tail.append(_REST_CLOSING.format(rest=labels))
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

    The answer opens with a sentence suited to the question form (what, why,
    how, compare, explain), then gives two to four accurate sentences for each
    recognised concept, a linking sentence when several concepts are
    discussed, and a closing sentence (which points to any concepts left out
    for length).  Prompts without a known concept get a general answer about
    language models.  Answers stay between 40 and 160 words.
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
        generic_link=rng.choice(_GENERIC_LINKS),
        closing=rng.choice(_CLOSINGS),
    )
    draft.reset(len(discussed))

    text = draft.render()
    while _word_count(text) > MAX_WORDS and draft.shrink():
        text = draft.render()
    while _word_count(text) < MIN_WORDS and draft.grow():
        text = draft.render()
    return text
