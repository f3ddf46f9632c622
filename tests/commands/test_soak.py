"""The soak's report (the soak itself runs against a real server: ``jupyter infer loadgen --soak``)."""

from __future__ import annotations

from collections import Counter

from jupyter_infer.commands.soak_report import Round, format_report, report


def a_round(rss: float, lost: int = 0) -> Round:
    return Round(sent=Counter(stream=10), lost=Counter({"stream: ReadTimeout": lost}) if lost else Counter(),
                 status_ms=[5.0, 7.0, 40.0], rss_mb=rss, fds=20, threads=6, wall_s=3.0)


def test_growth_is_measured_after_the_warm_up_round() -> None:
    summary = report([a_round(100.0), a_round(130.0), a_round(131.5, lost=2)])
    assert summary["growth_since_round"] == 1 and summary["rss_growth_mb"] == 1.5
    assert summary["lost"] == {"stream: ReadTimeout": 2} and summary["status_max_ms"] == 40.0
    assert "RSS +1.5 MB" in format_report(summary)


def test_two_rounds_compare_the_last_with_the_first() -> None:
    summary = report([a_round(100.0), a_round(130.0)])
    assert summary["growth_since_round"] == 0 and summary["rss_growth_mb"] == 30.0
