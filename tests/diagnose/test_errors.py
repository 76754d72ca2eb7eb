"""A Prometheus that is unreachable, slow, erroring or not Prometheus at all: a clear message and exit 2."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from oomguard.cli import main
from oomguard.common.ports import free_port


class Stub(http.server.BaseHTTPRequestHandler):
    mode = "500"

    def do_GET(self) -> None:
        if self.mode == "hang":
            time.sleep(3)
        body = {
            "500": b'{"status":"error","errorType":"internal","error":"query processing would load too many samples"}',
            "html": b"<html>Grafana</html>",
            "hang": b"{}",
            "huge": b'{"status":"success","data":{"resultType":"matrix","result":[]}}' + b" " * 4096,
        }[self.mode]
        self.send_response(500 if self.mode == "500" else 200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Handler", (Stub,), {"mode": request.param})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def diagnose(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["diagnose", *args])
    captured = capsys.readouterr()
    return status, captured.err


def test_unreachable(capsys) -> None:
    status, err = diagnose(capsys, "--prometheus", f"http://127.0.0.1:{free_port()}")
    assert status == 2
    assert "cannot reach Prometheus" in err and "refused" in err.lower() and "--prometheus" in err


@pytest.mark.parametrize("stub", ["hang"], indirect=True)
def test_slow(stub, capsys) -> None:
    started = time.monotonic()
    status, err = diagnose(capsys, "--prometheus", stub, "--timeout", "0.5")
    assert status == 2 and time.monotonic() - started < 3
    assert "did not answer within 0.5s" in err and "--window" in err


@pytest.mark.parametrize("stub", ["500"], indirect=True)
def test_http_error(stub, capsys) -> None:
    status, err = diagnose(capsys, "--prometheus", stub)
    assert status == 2
    assert "HTTP 500" in err and "too many samples" in err


@pytest.mark.parametrize("stub", ["html"], indirect=True)
def test_not_prometheus(stub, capsys) -> None:
    status, err = diagnose(capsys, "--prometheus", stub)
    assert status == 2
    assert "not Grafana" in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--window", "an hour", "not a duration"), ("--at", "yesterday", "not a time")],
)
def test_bad_arguments(capsys, flag: str, value: str, message: str) -> None:
    status, err = diagnose(capsys, "--prometheus", "http://127.0.0.1:9", flag, value)
    assert status == 2 and message in err


def test_exporter_unreachable(capsys) -> None:
    status, err = diagnose(capsys, "--exporter", f"http://127.0.0.1:{free_port()}")
    assert status == 2 and "cannot reach the exporter" in err and "--exporter" in err


@pytest.mark.parametrize("stub", ["huge"], indirect=True)
def test_an_answer_over_the_cap_is_refused_not_read_whole(stub, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from oomguard.diagnose import query

    monkeypatch.setattr(query, "MAX_ANSWER_BYTES", 1024)  # the real cap is 256 MiB: too large to send in a test
    status, err = diagnose(capsys, "--prometheus", stub)
    assert status == 2 and "answered more than 1,024 bytes" in err and "--window" in err
