"""The one small interface the scheduler drives, step by step, from its engine thread."""

from __future__ import annotations

import abc
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..sequence import Sequence


@dataclass
class EngineInfo:
    engine: str  # "hf" | "simulated"
    model: str
    device: str
    dtype: str
    max_context: int  # prompt + generated tokens one row can hold
    fallback_reason: str | None = None
    details: dict = field(default_factory=dict)


@dataclass
class StepPlan:
    """What one engine step runs.

    ``prefill``: run the prompts of ``seqs`` (newcomers), sample their first token and merge
    them into the running batch. ``decode``: one token for every running row; ``seqs`` are
    exactly the running rows, in the order they joined (the scheduler keeps that order). ``release`` rows leave the batch before the step runs.
    """

    step_id: int
    kind: Literal["prefill", "decode"]
    seqs: list[Sequence]
    release: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        if self.kind == "prefill":
            return sum(s.num_prompt_tokens for s in self.seqs)
        return len(self.seqs)


class Engine(abc.ABC):
    """A causal LM that keeps a running batch of rows between steps.

    All methods but ``tokenize``/``detokenize`` are called from the scheduler's single
    engine thread, so implementations need no locks for their batch state.
    """

    info: EngineInfo
    eos_token_ids: frozenset[int]

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, token_ids: Seq[int]) -> str: ...

    @abc.abstractmethod
    def step(self, plan: StepPlan) -> list[int]:
        """Run ``plan``; return one sampled token id per ``plan.seqs``, in order."""

    @abc.abstractmethod
    def release(self, row_ids: Seq[str]) -> None:
        """Drop these rows from the running batch (unknown ids are ignored)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Drop every running row (after a failed step left the batch state unknown)."""

    @property
    def num_running(self) -> int:
        return 0

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """A chat as one prompt; engines with a chat template override this."""
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join(lines) + "\nassistant:"
