"""``%infer_status`` says how the model is held (its format, not only the compute dtype) and how
loading goes."""

from __future__ import annotations

from jupyter_infer.kernel.status_view import (
    describe_cpu,
    describe_loading,
    describe_weights,
    served_rows,
)


def test_an_int4_model_is_shown_as_int4_with_its_bytes() -> None:
    status = {"state": "ready", "dtype": "float32",
              "details": {"quantize": "int4", "weight_bytes": 3 * 2**29, "rss_after_load_bytes": 2**31}}
    assert describe_weights(status) == "int4 (1.50 GiB of weights, 2.00 GiB resident)"
    assert describe_weights({"dtype": "bfloat16", "details": {"quantize": "none"}}) == "bfloat16"


def test_loading_says_where_it_is_and_then_what_it_took() -> None:
    loading = {"phase": "reading the linears into int4", "done": 42, "total": 168, "unit": "linears",
               "elapsed_s": 12.5, "phase_left_s": 30.2}
    assert describe_loading({"state": "loading", "loading": loading}) == (
        "reading the linears into int4: 42 of 168 linears (12.5 s so far, about 30 s left)")
    assert describe_loading({"state": "ready", "loading": {**loading, "phase": "done"}}) == "took 12.5 s"


def test_the_status_says_when_other_processes_starve_the_engine() -> None:
    assert describe_cpu({"cpu": {"threads": 2, "threads_max": 2, "starved": False}}) == "2 of 2"
    note = "other processes are using this machine's CPUs: ... the engine runs 1 thread(s) of 2"
    assert describe_cpu({"cpu": {"threads": 1, "threads_max": 2, "starved": True, "note": note}}) == note
    assert describe_cpu({"engine": "simulated"}) == "–"


def test_during_a_load_the_status_shows_what_loads_not_nones() -> None:
    """It said ``engine None, model None, device None`` while a model loaded."""
    loading = {"state": "loading", "engine": None, "model": None, "device": None,
               "configured": {"engine": "hf", "model": "small", "quantize": "int4"}}
    assert served_rows(loading) == [("engine", "hf (loading)"), ("model", "small (loading)"),
                                     ("device", "auto (loading)")]
    ready = {"state": "ready", "engine": "hf", "model": "small", "device": "cpu", "dtype": "float32"}
    assert served_rows(ready) == [("engine", "hf"), ("model", "small"), ("device", "cpu (float32)")]
