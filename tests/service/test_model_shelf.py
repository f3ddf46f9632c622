"""Models you can see and switch without restarting Jupyter: the listing (Hugging Face cache,
model folders, Ollama's store), a switch at run time with the queue drained, unloading (and
the next request bringing the model back), loading on demand and unloading when idle."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path

import pytest

from jupyter_infer.errors import EngineUnavailable, InvalidRequest, UnknownModel
from jupyter_infer.formats.model_catalog import (
    in_model_dirs,
    in_ollama_store,
    local_models,
    short_name,
)
from jupyter_infer.service.inference import InferenceService
from jupyter_infer.values.config import ServiceConfig
from jupyter_infer.values.request import Request, SamplingParams

pytestmark = pytest.mark.timeout(120)


def ollama_store(root: Path, gguf: bytes) -> Path:
    """Ollama's layout: a manifest per name:tag naming its weights' blob."""
    digest = "sha256:" + "ab" * 32
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / digest.replace(":", "-")).write_bytes(gguf)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "qwen2.5" / "0.5b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": digest, "size": len(gguf)}]}))
    return root


def test_the_listing_finds_folders_gguf_files_and_ollamas_models(tiny_model_dir: Path, tmp_path: Path) -> None:
    shelf = tmp_path / "models"
    shutil.copytree(tiny_model_dir, shelf / "team" / "tiny")
    (shelf / "q4.gguf").write_bytes(b"GGUF" + bytes(8))
    (shelf / "notes").mkdir()
    store = ollama_store(tmp_path / "ollama", b"GGUF" + bytes(16))
    found = {m.id: m for m in local_models([str(shelf)], hf_cache=False, ollama=store)}
    assert {m.source for m in found.values()} == {"folder", "gguf", "ollama"}
    # Named as under their folder, not by their absolute path (lists and the panel cut those).
    assert found["team/tiny"].path == str(shelf / "team" / "tiny") and found["team/tiny"].size_bytes > 0
    assert found["q4.gguf"].path == str(shelf / "q4.gguf")
    ollama = found["qwen2.5:0.5b"]
    assert ollama.path.endswith("sha256-" + "ab" * 32) and ollama.size_bytes == 20
    # serve --model qwen2.5:0.5b (or qwen2.5, its :latest) finds the blob; the blob is shown by that name.
    assert in_ollama_store("qwen2.5:0.5b", store) == ollama and in_ollama_store("qwen2.5", store) is None
    assert short_name(ollama.path, [str(shelf)], store) == "qwen2.5:0.5b"


def test_a_name_under_two_folders_is_listed_once_by_it_and_a_listed_name_finds_its_path(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    for folder in ("a", "b"):
        shutil.copytree(tiny_model_dir, tmp_path / folder / "tiny")
    folders = [str(tmp_path / "a"), str(tmp_path / "b")]
    ids = [m.id for m in local_models(folders, hf_cache=False, ollama=tmp_path / "none")]
    assert ids == ["tiny", str(tmp_path / "b" / "tiny")]  # the second by its path: no name names two models
    assert in_model_dirs("tiny", folders) == str(tmp_path / "a" / "tiny")
    assert in_model_dirs("nothing", folders) is None and in_model_dirs(str(tmp_path / "b" / "tiny"), folders) is None
    assert short_name(str(tmp_path / "b" / "tiny"), folders) == "tiny" and short_name("/elsewhere", folders) is None


async def answer(service: InferenceService, text: str = "What is batching?", **kw: object) -> str:
    stream = await service.submit(Request(text, SamplingParams(max_tokens=3, temperature=0), **kw))
    await stream.result()
    return stream.model or ""


async def until_unloaded(service: InferenceService) -> None:
    """Until the shelf has unloaded the idle model (a few seconds at most)."""
    for _ in range(100):
        if service.state == "unloaded":
            return
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_a_model_is_switched_at_run_time_and_waiting_requests_go_to_the_new_one(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    service = InferenceService(ServiceConfig(engine="simulated", model_dirs=(str(tmp_path),), switch_drain_s=5))
    service.start()
    try:
        assert await answer(service) == "simulated"
        running = await service.submit(Request("a long one", SamplingParams(max_tokens=30)))
        switch = asyncio.ensure_future(service.models.load(str(tiny_model_dir), num_threads=1))
        await asyncio.sleep(0.05)
        assert service.state == "switching"
        waiting = asyncio.ensure_future(answer(service))  # sent during the switch: waits for the new model
        info = await switch
        assert info.engine == "hf" and (await running.result()).finish_reason == "length"  # it finished first
        assert await waiting == str(tiny_model_dir)
        listing = service.models.listing()
        assert listing[0]["path"] == str(tiny_model_dir) and listing[0]["loaded"]
        with pytest.raises(InvalidRequest, match="No model at"):  # refused before anything is dropped
            await service.models.load(str(tmp_path / "missing"))
        assert service.state == "ready" and await answer(service) == str(tiny_model_dir)
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "config.json").write_text("{}")  # looks like a model, does not load
        with pytest.raises(EngineUnavailable, match=r"The previous model \(.*tiny\) is loaded again"):
            await service.models.load(str(broken))
        assert service.state == "ready" and await answer(service) == str(tiny_model_dir)
        await service.models.load("simulated")
        assert await answer(service) == "simulated"
        with pytest.raises(InvalidRequest, match="may set quantize"):
            await service.models.load("simulated", colour="red")
    finally:
        await service.stop()


@pytest.mark.asyncio
async def test_unloaded_after_idle_seconds_and_back_for_the_next_request(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jupyter_infer")
    service = InferenceService(ServiceConfig(engine="simulated", model_dirs=(str(tmp_path),), unload_after_s=0.2))
    service.start()
    try:
        await answer(service)
        await until_unloaded(service)
        assert service.state == "unloaded" and service.info is None
        said = [r.getMessage() for r in caplog.records]
        assert any("unloading simulated after 0.2 idle seconds" in m for m in said), said  # the log says why
        assert await answer(service) == "simulated"  # the next request brings it back
        assert service.state == "ready"
    finally:
        await service.stop()


@pytest.mark.asyncio
async def test_a_request_naming_a_listed_model_loads_it_on_demand(tiny_model_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_model_dir, tmp_path / "tiny")
    listed = str(tmp_path / "tiny")
    config = ServiceConfig(engine="simulated", model_dirs=(str(tmp_path),), num_threads=1)
    refusing = InferenceService(config)
    refusing.start()
    try:
        with pytest.raises(UnknownModel, match="on this machine but not loaded: load it"):
            await answer(refusing, model=listed)  # load_on_demand off: refused, saying how to load it
    finally:
        await refusing.stop()
    service = InferenceService(ServiceConfig(engine="simulated", model_dirs=(str(tmp_path),), num_threads=1,
                                             load_on_demand=True))
    service.start()
    try:
        assert await answer(service, model=listed) == "tiny"  # its listed name
        assert service.info.engine == "hf"
    finally:
        await service.stop()


@pytest.fixture
def infer_options(tmp_path: Path, tiny_model_dir: Path) -> dict[str, object]:
    """The server of the test below: a shelf folder with one model, load_on_demand on."""
    shutil.copytree(tiny_model_dir, tmp_path / "shelf" / "tiny")
    return {"engine": "auto", "load_on_demand": True, "model_dirs": [str(tmp_path / "shelf")]}


async def test_v1_models_lists_what_a_request_may_load_with_load_on_demand(jp_fetch, tmp_path: Path) -> None:
    """Ollama's way: v1/models names the loaded model first, then what a request may load."""
    data = json.loads((await jp_fetch("infer", "v1", "models")).body)["data"]
    listed = str(tmp_path / "shelf" / "tiny")
    assert data[0]["id"] != listed and "loaded" not in data[0]
    assert {"id": "tiny", "root": listed, "loaded": False}.items() <= data[-1].items()  # its name, then its path
    # ... and an OpenAI request naming it loads it (the OpenAI routes check the model early).
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}  # its folder's own name will do
    answer = json.loads((await jp_fetch("infer", "v1", "completions", method="POST", body=json.dumps(body))).body)
    assert answer["model"] == "tiny" and answer["usage"]["completion_tokens"] == 2  # its listed name


@pytest.mark.asyncio
async def test_requests_for_two_models_at_once_queue_for_their_model_and_never_get_a_503(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two agents on two models, load on demand: each request waits its model's turn (the loaded
    model's queue first), none is refused, and the models switch once, not per request."""
    for name in ("small", "other"):
        shutil.copytree(tiny_model_dir, tmp_path / name)
    small, other = str(tmp_path / "small"), str(tmp_path / "other")
    service = InferenceService(ServiceConfig(engine="hf", model=small, model_dirs=(str(tmp_path),), num_threads=1,
                                             load_on_demand=True, switch_drain_s=5, switches_per_minute=30))
    service.start()
    try:
        assert await answer(service, model=small) == "small"  # answers name it as listed
        sent = [asyncio.ensure_future(answer(service, model=m)) for m in (small, other, small, other, small, other)]
        await asyncio.sleep(0.05)
        assert service.models.answer()["waiting"] == {other: 3}  # infer/models shows who waits for what
        served = await asyncio.gather(*sent)
        assert served == ["small", "other", "small", "other", "small", "other"]
        assert service.models.switches == 1  # the loaded model's requests first, then the other's
        # Later ones for the loaded model need no switch; the next for the first waits its turn.
        assert await asyncio.gather(answer(service, model=other), answer(service, model=small)) == ["other", "small"]
        assert service.models.switches == 2
    finally:
        await service.stop()


@pytest.mark.asyncio
async def test_after_an_idle_unload_a_request_for_another_model_loads_only_that_one(
        tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jupyter_infer")
    for name in ("small", "other"):
        shutil.copytree(tiny_model_dir, tmp_path / name)
    small, other = str(tmp_path / "small"), str(tmp_path / "other")
    service = InferenceService(ServiceConfig(engine="hf", model=small, model_dirs=(str(tmp_path),), num_threads=1,
                                             load_on_demand=True, unload_after_s=0.2))
    service.start()
    try:
        await answer(service)
        await until_unloaded(service)
        assert service.state == "unloaded"
        assert await answer(service, model=other) == "other"
        said = [r.getMessage() for r in caplog.records]
        after = said[next(i for i, m in enumerate(said) if "unloading" in m):]
        assert not [m for m in after if f"loading {small}:" in m], after  # the unloaded one was not loaded again
        assert any(f"loading {other}:" in m for m in after)
    finally:
        await service.stop()


@pytest.mark.asyncio
async def test_past_its_switches_a_minute_the_loaded_model_serves_its_own_and_the_other_waits(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    for name in ("small", "other"):
        shutil.copytree(tiny_model_dir, tmp_path / name)
    small, other = str(tmp_path / "small"), str(tmp_path / "other")
    service = InferenceService(ServiceConfig(engine="hf", model=small, model_dirs=(str(tmp_path),), num_threads=1,
                                             load_on_demand=True, switches_per_minute=1))
    service.start()
    try:
        assert await answer(service, model=other) == "other"  # the minute's one switch, at once
        back = asyncio.ensure_future(answer(service, model=small))
        await asyncio.sleep(0.3)
        assert service.models.answer()["waiting"] == {small: 1} and not back.done()
        assert await answer(service, model=other) == "other"  # the loaded model serves its own meanwhile
        assert service.models.switches == 1
        back.cancel()
        with pytest.raises(asyncio.CancelledError):
            await back
        assert service.models.answer()["waiting"] == {}  # a caller who gave up waits no more
    finally:
        await service.stop()
