"""Shared fixtures: locally built models (never downloaded) and the pytest-jupyter plugin."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from server_helpers import server_config, use_scripted_engine

# Never reach for a model hub from tests; the models below are built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# The quantized-weight cache of this run's loads: its own, not the user's ~/.cache (a test that
# loads a model must not be served weights another test, or another run, quantized).
os.environ.setdefault("JUPYTER_INFER_CACHE", tempfile.mkdtemp(prefix="jupyter-infer-test-cache-"))

# openai_fixtures: base_url, client, http for the OpenAI routes (a module that defines its own wins).
pytest_plugins = ["pytest_jupyter.jupyter_server", "openai_fixtures"]


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model_dir(models_dir: Path) -> Path:
    """A GPT-2-shaped model with random weights and a locally trained BPE tokenizer."""
    from jupyter_infer.commands.model_builder import make_model

    return make_model(models_dir / "tiny", "tiny")


@pytest.fixture(scope="session")
def llama_model_dir(models_dir: Path) -> Path:
    """A Llama-shaped model (RoPE, grouped-query attention), built locally."""
    from jupyter_infer.commands.model_builder import make_model

    return make_model(models_dir / "llama-tiny", "llama-tiny")


@pytest.fixture(scope="session")
def coder_model_dir(models_dir: Path) -> Path:
    """llama-tiny with Qwen2.5-Coder's fill-in-the-middle tokens: infill in small."""
    from jupyter_infer.commands.model_builder import make_model

    return make_model(models_dir / "coder-tiny", "coder-tiny")


@pytest.fixture(scope="session")
def embed_model_dir(models_dir: Path) -> Path:
    """A BERT encoder with sentence-transformers' files (mean pooling): an embedding model."""
    from jupyter_infer.commands.model_builder import make_model

    return make_model(models_dir / "embed-tiny", "embed-tiny")


@pytest.fixture(scope="session")
def rerank_model_dir(models_dir: Path) -> Path:
    """A BERT cross-encoder (a one-label head; pairs as [CLS] a [SEP] b [SEP]): a reranker."""
    from jupyter_infer.commands.model_builder import make_model

    return make_model(models_dir / "rerank-tiny", "rerank-tiny")


# -- the in-process Jupyter server of the server tests (pytest-jupyter's jp_* fixtures) ------
@pytest.fixture
def infer_options() -> dict[str, Any]:
    """``InferApp`` options for ``jp_serverapp``; override with ``@pytest.mark.parametrize``."""
    return {}


@pytest.fixture
def jp_server_config(infer_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    if infer_options.get("engine", "simulated") == "simulated":
        use_scripted_engine(monkeypatch)
    return server_config(**infer_options)
