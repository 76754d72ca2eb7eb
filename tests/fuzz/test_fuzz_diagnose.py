"""Fuzzing what `oomguard diagnose` reads: Prometheus' query_range answers and an exporter's /metrics.

The bulk goes to the functions that read an answer (`fetch_prometheus`, `fetch_exporter`, with the HTTP
request replaced by the fuzzed body): they return Data of well-typed series (names and labels strings,
points floats) or raise DiagnoseError, which the command turns into exit status 2. A few answers go
through the whole command against a local HTTP server: exit status 0, 1 or 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import io
import json
import sys
import threading
from collections.abc import Iterator
from unittest import mock

from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from support import REPO

from oomguard.cli import main
from oomguard.diagnose import query
from oomguard.diagnose.query import METRICS, Data, DiagnoseError, fetch_exporter, fetch_prometheus
from tests.fuzz.fuzz_strategies import with_invalid_utf8

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _as_exported(labels: dict[str, str]) -> dict[str, str]:
    """The exporter always writes a gpu label on oomguard_target_gpu_info (a relabelling may drop it: below)."""
    if labels["__name__"] == "oomguard_target_gpu_info":
        return {"gpu": "0", **labels}
    return labels


LABELS = st.fixed_dictionaries(
    {"__name__": st.sampled_from(METRICS)},
    optional={
        "instance": st.sampled_from(["exp:9847", "other:9847"]),
        "target": st.sampled_from(["t1", "t2"]),
        "gpu": st.sampled_from(["0", "1"]),
        "model_name": st.just("m"),
        "state": st.sampled_from(["up", "down", "loading", "steady", "climbing", "spike"]),
        "kind": st.sampled_from(["cuda_oom", "startup_memory", "engine_death", "cgroup_oom_kill"]),
    },
).map(_as_exported)


VALUE = st.one_of(
    st.floats(min_value=-1e12, max_value=1e12).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "0", "1", "0.97", "1e999"]),
)


@st.composite
def matrix_answer(draw: st.DrawFn, wrong: int = 16) -> object:
    """A query_range answer: well formed, with now and then (one in `wrong`) a wrong type at any level."""

    def _maybe_wrong(draw: st.DrawFn, good):
        """`good`, or now and then a value of the wrong type (what a proxy or another API might send)."""
        return draw(ANY_JSON) if draw(st.integers(0, wrong - 1)) == 0 else good

    result = []
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.floats(1.6e9, 1.8e9))
        points = [
            [_maybe_wrong(draw, start + 15 * i), _maybe_wrong(draw, draw(VALUE))]
            for i in range(draw(st.integers(0, 8)))
        ]
        result.append({"metric": _maybe_wrong(draw, draw(LABELS)), "values": _maybe_wrong(draw, points)})
    answer = {"status": "success", "data": {"resultType": "matrix", "result": _maybe_wrong(draw, result)}}
    if draw(st.integers(0, 10)) == 0:
        answer = {"status": "error", "errorType": "bad_data", "error": draw(ANY_JSON)}
    return _maybe_wrong(draw, answer)


# The synthetic histories of tests/diagnose (an OOM incident, a slow leak, a healthy engine ...).
_spec = importlib.util.spec_from_file_location("diagnose_histories", REPO / "tests" / "diagnose" / "histories.py")
histories = sys.modules["diagnose_histories"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(histories)
HISTORY_NAMES = sorted(f.__name__ for f in (histories.incident, histories.slow_leak, histories.healthy,
                                            histories.startup_memory, histories.probe_kill))  # fmt: skip
AT = 1_800_000_000.0


@st.composite
def damaged_history(draw: st.DrawFn) -> dict:
    """A real history as Prometheus would answer it, damaged: values NaN, infinite, negative or huge, points
    and series dropped or duplicated, labels missing."""
    history = getattr(histories, draw(st.sampled_from(HISTORY_NAMES)))()
    series = histories.samples(history, AT - histories.SPAN)
    result = []
    for (name, labels), points in series.items():
        if draw(st.integers(0, 9)) == 0:
            continue  # a series missing
        metric = {"__name__": name, **dict(labels)}
        if draw(st.integers(0, 19)) == 0:
            metric.pop(draw(st.sampled_from(sorted(metric))))  # a label missing (the name too)
        values = [[t, repr(v)] for t, v in points]
        for _ in range(draw(st.integers(0, 3))):
            if values:
                i = draw(st.integers(0, len(values) - 1))
                action = draw(st.sampled_from(["value", "drop", "dup"]))
                if action == "value":
                    values[i][1] = draw(st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e300", "0"]))
                elif action == "drop":
                    del values[i:]
                else:
                    values.insert(i, list(values[i]))
        result.append({"metric": metric, "values": values})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _dump(answer: object) -> bytes:
    return json.dumps(answer).encode()  # NaN and Infinity as Python writes them: not JSON, but json.loads reads them


PROMETHEUS_BODIES = st.one_of(
    matrix_answer().map(_dump),
    ANY_JSON.map(_dump),
    matrix_answer().map(_dump).flatmap(with_invalid_utf8),
    st.binary(max_size=40),
)


def check_data(data: Data) -> None:
    for series in data.series:
        assert isinstance(series.name, str), series
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in series.labels.items()), series
        assert all(isinstance(t, float) and isinstance(v, float) for t, v in series.points), series


def read_prometheus(body: bytes) -> str:
    with mock.patch.object(query, "_get", return_value=body):
        try:
            data = fetch_prometheus("http://prometheus:9090", start=1.6e9, end=1.8e9)
        except DiagnoseError as exc:
            assert str(exc)
            return "DiagnoseError"
    check_data(data)
    return "data"


@given(body=PROMETHEUS_BODIES)
@example(body=b"[" * 100_000)  # nested deeper than json's recursion
@example(
    body=_dump({"status": "success", "data": {"result": [{"metric": {"__name__": "x"}, "values": [[1, 10**400]]}]}})
)
@example(body=_dump({"status": "success", "data": {"result": [{"metric": {"__name__": 5, "gpu": 0}, "values": []}]}}))
@example(body=_dump({"status": "error", "errorType": "execution", "error": "query timed out"}))
def test_a_prometheus_answer_is_data_or_a_diagnose_error(body: bytes) -> None:
    event(read_prometheus(body))


EXPOSITION_LINE = st.one_of(
    st.builds(
        lambda name, labels, value: f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in labels.items())}}} {value}",
        st.sampled_from(METRICS),
        st.dictionaries(st.sampled_from(["target", "gpu", "state", "kind"]), st.text(max_size=6), max_size=3),
        VALUE,
    ),
    st.sampled_from(METRICS).map(lambda m: f"# TYPE {m} {'counter' if m.endswith('_total') else 'gauge'}"),
    st.text(max_size=30),
)


@given(body=st.one_of(st.lists(EXPOSITION_LINE, max_size=12).map("\n".join).map(str.encode), st.binary(max_size=60)))
def test_an_exporter_answer_is_data_or_a_diagnose_error(body: bytes) -> None:
    with mock.patch.object(query, "_get", return_value=body):
        try:
            data = fetch_exporter("http://exporter:9847", now=1.7e9)
        except DiagnoseError as exc:
            assert str(exc)
            event("DiagnoseError")
            return
    check_data(data)
    event("data")


# -- through the command ---------------------------------------------------------------------------------


class _Server:
    """A local HTTP server answering every GET with `body` (200), as Prometheus or an exporter."""

    def __init__(self) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *args: object) -> None:
                pass

        self.body = b""
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    @contextlib.contextmanager
    def running(self) -> Iterator[_Server]:
        thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.http.shutdown()
            self.http.server_close()


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(answer=st.one_of(matrix_answer(), damaged_history()), exporter=st.booleans())
@example(answer={"status": "error", "errorType": "bad_data", "error": "parse error"}, exporter=False)
def test_the_command_exits_0_1_or_2_never_with_a_traceback(answer: object, exporter: bool) -> None:
    """Whatever Prometheus (or the exporter) answers, `oomguard diagnose` ends with its exit status: 2 with a
    message when the answer cannot be read, 0 or 1 with a diagnosis when it can."""
    server = _Server()
    server.body = _dump(answer) if not exporter else _exposition(answer)
    out, err = io.StringIO(), io.StringIO()
    with server.running(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["diagnose", "--exporter" if exporter else "--prometheus", server.url, "--timeout", "5",
                       "--at", f"{AT:.0f}", "--window", "1h"])  # fmt: skip
    assert status in (0, 1, 2)
    if status == 2:  # could not run (a message), or no series to judge (a diagnosis that says so)
        assert err.getvalue().startswith("oomguard diagnose: ") or "INSUFFICIENT_DATA" in out.getvalue(), (
            out.getvalue(),
            err.getvalue(),
        )
    else:
        assert out.getvalue(), err.getvalue()
    event(f"exit {status}")


def _exposition(answer: object) -> bytes:
    """The same series as an exporter's /metrics would show them (one point each), where the answer has any."""
    lines = []
    with contextlib.suppress(AttributeError, KeyError, TypeError, IndexError, ValueError):
        for item in answer["data"]["result"]:  # type: ignore[index]
            labels = dict(item["metric"])
            name = labels.pop("__name__")
            value = item["values"][-1][1] if item["values"] else "0"
            text = ",".join(f"{k}={json.dumps(str(v))}" for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {value}")
    return "\n".join(str(line) for line in lines).encode()


def _incident_with(value: str) -> dict:
    """The incident history as Prometheus answers it, with every value of oomguard_engine_requests_running and
    oomguard_target_startup_seconds replaced by `value`."""
    series = histories.samples(histories.incident(), AT - histories.SPAN)
    result = []
    for (name, labels), points in series.items():
        damaged = name in ("oomguard_engine_requests_running", "oomguard_target_startup_seconds")
        result.append(
            {
                "metric": {"__name__": name, **dict(labels)},
                "values": [[t, value if damaged else repr(v)] for t, v in points],
            }
        )
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def run_command(answer: object) -> tuple[int, str, str]:
    server = _Server()
    server.body = _dump(answer)
    out, err = io.StringIO(), io.StringIO()
    with server.running(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["diagnose", "--prometheus", server.url, "--at", f"{AT:.0f}", "--window", "1h"])
    return status, out.getvalue(), err.getvalue()


def test_infinite_values_are_no_reading_not_a_traceback() -> None:
    """Bug found by fuzzing: a +Inf value (Prometheus writes "+Inf"; an engine that reported one passes it on)
    reached the recommendations, whose int(math.ceil(inf)) raised OverflowError out of `oomguard diagnose`."""
    status, out, err = run_command(_incident_with("+Inf"))
    assert status in (0, 1) and "OOM" in out.upper(), (out, err)


def test_an_answer_json_cannot_read_is_a_diagnose_error() -> None:
    """Bug found by fuzzing: an answer nested deeper than Python's recursion limit (RecursionError), a value
    too large for a float (OverflowError), and labels that are not strings (a TypeError later, in the
    diagnosis) escaped as tracebacks instead of exit status 2."""
    ok = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    bodies = [
        b"[" * 100_000,
        _dump({**ok, "data": {"result": [{"metric": {"__name__": "x"}, "values": [[1, 10**400]]}]}}),
        _dump({**ok, "data": {"result": [{"metric": {"__name__": "x", "gpu": 0}, "values": [[1, "1"]]}]}}),
        _dump({**ok, "data": {"result": [{"metric": {"__name__": 7}, "values": [[1, "1"]]}]}}),
        _dump({**ok, "data": {"result": [{"metric": {"__name__": "x"}, "values": [[float("inf"), "1"]]}]}}),
    ]
    for body in bodies:
        assert read_prometheus(body) == "DiagnoseError", body[:80]


def test_a_target_gpu_info_without_its_gpu_label() -> None:
    """Found by fuzzing: a relabelling that drops the gpu label of oomguard_target_gpu_info raised KeyError."""
    answer = _incident_with("1")
    for item in answer["data"]["result"]:
        if item["metric"]["__name__"] == "oomguard_target_gpu_info":
            del item["metric"]["gpu"]
    status, _, err = run_command(answer)
    assert status in (0, 1, 2) and "Traceback" not in err
