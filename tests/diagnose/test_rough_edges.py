"""What diagnose says agrees with itself and with what it read: one reading of an
exporter claims no history it has not seen, a summary says no more than its criteria, a window too short to size
the KV cache sizes nothing, advice reads as advice, a report format is refused before anything is read, and the
plot's reference lines hide neither each other nor the curves.

The histories of histories.py are read here as diagnose would read them, without a Prometheus: the whole hour,
its last minutes (a short --window), or its last instant (one reading of --exporter)."""

from __future__ import annotations

import json

import pytest

from oomguard.bundle.thresholds import default_thresholds
from oomguard.cli import main
from oomguard.common.ports import free_port
from oomguard.diagnose import report
from oomguard.diagnose.core import Diagnosis, diagnose_data
from oomguard.diagnose.query import Data, Series
from tests.diagnose import histories
from tests.diagnose.histories import History, Moment

START = 1.7e9  # any time: the histories' clock starts here
END = START + histories.SPAN


def read(h: History, *, window: float | None = None, history: bool = True) -> Data:
    """The history as diagnose reads it: over the last `window` seconds, or (history=False) its last instant."""
    start = END - window if window is not None else START
    series = []
    for (name, labels), points in histories.samples(h, START).items():
        points = [p for p in points if p[0] >= start] if history else [p for p in points if p[0] == END]
        if points:
            series.append(Series(name, dict(labels), points))
    return Data(series, start if history else END, END, history, "exporter http://127.0.0.1:9847/metrics"
                if not history else "prometheus http://127.0.0.1:9090")  # fmt: skip


def one(data: Data, **kwargs) -> Diagnosis:
    (d,) = diagnose_data(data, **kwargs)
    return d


def watched_climb() -> History:
    """vLLM at 0.90; memory climbs from 84 % to 99 % of the GPU over the hour, the exporter saying climbing, and
    saturated once pinned near the top: what a user watched before reading the exporter once."""

    def moment(t: float) -> Moment:
        use = 0.84 + 0.15 * t / histories.SPAN
        return Moment(use, kv=0.4, running=6.0, trend="saturated" if use + 0.006 >= 0.97 else "climbing")

    return History("watched-climb", 0.9, moment, startup_seconds=[(0.0, 30.0)])


def pinned_in_the_reservation() -> History:
    """vLLM at 0.95, 97.6 % of the GPU used and a CUDA OOM: the exporter says saturated (>= 97 %), while
    diagnose's own measure (90 % of the headroom the reservation leaves) is not reached: (0.976 - 0.95) / 0.05."""

    def moment(t: float) -> Moment:
        return Moment(0.97, kv=0.4, running=6.0, trend="saturated")

    return History("pinned", 0.95, moment, events={"cuda_oom": [1800.0]}, startup_seconds=[(0.0, 30.0)])


# ---- one reading claims no history -------------------------------------------------------------


def test_one_reading_after_a_climb_does_not_say_there_was_none() -> None:
    d = one(read(watched_climb(), history=False))
    assert d.facts is not None and d.facts.headroom_used_peak is not None
    assert d.facts.headroom_used_peak > default_thresholds().headroom_critical, "the reading is at the top"
    assert "without a climb" not in d.summary and "straight" not in d.summary
    assert "one reading cannot tell a climb from a spike" in d.summary
    assert "at the top now" in d.summary
    # The history the user watched says what it was.
    assert one(read(watched_climb())).verdict == "memory_leak"


# ---- a summary says no more than its criteria --------------------------------------------------


CASES = {
    "pinned, one reading": (pinned_in_the_reservation, False),
    "pinned, history": (pinned_in_the_reservation, True),
    "watched climb, one reading": (watched_climb, False),
    **{f"{h.__name__}, {'history' if hist else 'one reading'}": (h, hist) for h in
       (histories.incident, histories.foreign_process, histories.tight_steady) for hist in (True, False)},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_summary_says_memory_is_at_the_top_only_where_a_criterion_does(case: str, capsys) -> None:
    make, history = CASES[case]
    d = one(read(make(), history=history))
    top = {k: v for k, v in d.json()["criteria"].items() if "at the top" in k}
    if "to the top" in d.summary or "at the top" in d.summary:
        assert top and all(top.values()), (d.summary, d.json()["criteria"])
    # And the JSON a user reads carries the same summary and criteria.
    body = json.loads(report.to_json([d]))["diagnoses"][0]
    assert (body["summary"], body["criteria"]) == (d.summary, d.criteria)


def test_pinned_near_the_top_is_said_and_met() -> None:
    """The exporter's saturated state, and an OOM, on a GPU whose reservation leaves little headroom: the summary
    and the criterion both say memory is at the top (before, the one said so and the other said false)."""
    d = one(read(pinned_in_the_reservation(), history=False))
    assert d.verdict == "memory_overcommit"
    assert "at the top now" in d.summary
    assert d.criteria["memory at the top"] is True


def test_an_oom_below_the_top_is_not_called_the_top() -> None:
    """One reading of the incident between two lives: OOMs counted, memory not at the top. The summary says it ran
    out, not that it went to the top (before: "went straight to the top" beside "memory at the top": false)."""
    d = one(read(histories.incident(), history=False))
    assert d.facts is not None and not d.facts.memory_top and d.facts.ooms
    assert d.criteria["memory at the top"] is False
    assert "memory ran out" in d.summary and "the top" not in d.summary.split(":")[1]


# ---- a short window sizes nothing it cannot ----------------------------------------------------


def test_a_window_too_short_for_the_capacity_recommends_no_figure() -> None:
    d = one(read(histories.incident(), window=300.0))
    assert d.verdict == "memory_overcommit"
    check = d.facts.capacity_check  # type: ignore[union-attr]
    assert check.capacity is None and check.samples < 10
    assert any("capacity in requests is not known" in item.finding for item in d.evidence)
    (seqs,) = [r for r in d.recommendations if r.setting == "max_num_seqs"]
    assert seqs.suggested is None, "no figure where step 3 says the capacity is not known"
    assert "too few points" in seqs.why and "--window" in seqs.why
    # The hour sizes it, and the figure comes back.
    (seqs,) = [r for r in one(read(histories.incident())).recommendations if r.setting == "max_num_seqs"]
    assert seqs.suggested == 11


# ---- advice reads as advice; each paragraph once -----------------------------------------------


def liveness() -> History:
    """all_histories()'s: an engine that starts within the probe's grace and is killed while serving."""
    return histories.probe_kill("probe-kill-liveness", load=40.0, kill_after=120.0)


@pytest.mark.parametrize("make", [histories.slow_leak, histories.probe_kill, liveness])
def test_no_unknown_to_unknown(make) -> None:
    for window in (None, 300.0):
        d = one(read(make(), window=window))
        text = report.text([d])
        assert "unknown -> unknown" not in text, text
        advice = [r for r in d.recommendations if r.current is None and r.suggested is None]
        for r in advice:
            assert f"     - {r.setting}\n" in text


def test_the_liveness_probe_advice_names_itself_alone() -> None:
    d = one(read(liveness()))
    assert d.verdict == "probe_kill"
    assert "     - liveness probe\n" in report.text([d])


@pytest.mark.parametrize("make", [histories.incident, histories.foreign_process, histories.healthy])
def test_the_unknown_cap_is_explained_once(make) -> None:
    for window in (None, 300.0):
        d = one(read(make(), window=window))
        assert d.facts is not None and d.facts.capacity_check.cap is None
        text = report.text([d])
        assert text.count("no oomguard_engine_setting series") == 1, text


# ---- one exporter read: its own words ----------------------------------------------------------


def test_an_unknown_target_on_an_exporter_names_its_targets() -> None:
    d = one(read(histories.healthy(), history=False), target="nope")
    assert d.verdict == "insufficient_data"
    for word in ("Prometheus", "--window", "--at", "window"):
        assert word not in d.summary, d.summary
    assert "its targets are vllm" in d.summary


def test_an_exporter_without_the_series_says_so_without_a_window() -> None:
    d = one(read(histories.bare(), history=False))
    assert d.verdict == "insufficient_data"
    assert "window" not in d.summary and "/metrics" in d.summary


# ---- --report's format, before anything --------------------------------------------------------


def test_an_unknown_report_format_is_refused_before_anything_is_read(tmp_path, capsys) -> None:
    # Nothing listens on the port: had diagnose read first, it would fail on that instead.
    url = f"http://127.0.0.1:{free_port()}"
    status = main(["diagnose", "--prometheus", url, "--report", str(tmp_path / "x.pdf")])
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert ".md or .html" in err and "127.0.0.1" not in err
    assert not list(tmp_path.iterdir())


# ---- the plot ----------------------------------------------------------------------------------


def _lines(ax) -> tuple[list, list]:
    """(reference lines: horizontal, across the axes; curves: the rest with a label)."""
    reference, curves = [], []
    for line in ax.get_lines():
        ys = list(line.get_ydata())
        horizontal = len(ys) == 2 and ys[0] == ys[1] and list(line.get_xdata()) == [0, 1]
        (reference if horizontal else curves).append(line)
    return reference, [c for c in curves if not c.get_label().startswith("_") and c.get_marker() in ("None", "")]


@pytest.mark.parametrize("make", [histories.incident, histories.over_admitted, histories.tight_steady])
def test_the_plots_reference_lines_hide_nothing(make) -> None:
    pytest.importorskip("matplotlib", reason="the report's plots need the report extra (matplotlib)")
    d = one(read(make()))
    fig = report.plot_figure(d.facts, "t")
    memory_ax, kv_ax, queue_ax = fig.axes
    reference, curves = _lines(memory_ax)
    heights = [line.get_ydata()[0] for line in reference]
    # No two at one height: the 90 % line is not under the reservation's (incident: both 0.9).
    assert all(abs(a - b) >= 0.005 for i, a in enumerate(heights) for b in heights[i + 1 :]), heights
    labels = " / ".join(line.get_label() for line in reference)
    assert "90 %" in labels and "reservation" in labels, labels
    for ax in (memory_ax, kv_ax, queue_ax):
        reference, curves = _lines(ax)
        assert curves
        for curve in curves:
            for line in reference:
                assert curve.get_zorder() > line.get_zorder(), (curve.get_label(), line.get_label())
    # "running" is drawn over the cache's capacity line, which it runs along when the cache binds.
    reference, curves = _lines(queue_ax)
    if d.facts.capacity_check.capacity is not None:  # type: ignore[union-attr]
        (capacity,) = [line for line in reference if "KV cache holds" in line.get_label()]
        (running,) = [c for c in curves if c.get_label() == "running"]
        assert running.get_zorder() > capacity.get_zorder()


# ---- a figure beyond the whole GPU is no reading ------------------------------------------------


def test_a_wrapped_figure_beyond_the_whole_gpu_recommends_nothing_from_it() -> None:
    # An unsigned figure wrapped to about 2**64 bytes (a simulated engine's age read before its start did it in
    # CI): the diagnosis said 21474836390 % of the GPU beyond the reservation and gpu_memory_utilization -2e8.
    data = read(watched_climb())
    wrapped = 0
    for s in data.series:
        if s.name in ("oomguard_gpu_memory_unreserved_used_bytes", "oomguard_gpu_memory_engine_over_reservation_bytes"):
            t, _ = s.points[len(s.points) // 2]
            s.points[len(s.points) // 2] = (t, float(2**64 - 1))
            wrapped += 1
    assert wrapped, "the history carries the join series"
    d = one(data)
    clean = one(read(watched_climb()))
    assert d.facts is not None and clean.facts is not None
    assert d.facts.unreserved_peak_ratio == clean.facts.unreserved_peak_ratio
    assert [(r.setting, r.suggested) for r in d.recommendations] == [
        (r.setting, r.suggested) for r in clean.recommendations
    ]


def test_without_matplotlib_the_report_names_the_install_that_works_from_a_clone(monkeypatch) -> None:
    """oomguard runs from a clone (the README's quick start), where `pip install 'oomguard[report]'` would look
    for a published package: the line names the clone's command first."""
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(report.MissingExtra) as raised:
        report.plot_figure(one(read(histories.incident())).facts, "t")  # type: ignore[arg-type]
    assert "from a clone: .venv/bin/pip install -e '.[report]'" in str(raised.value), raised.value
    assert "\n" not in str(raised.value)
