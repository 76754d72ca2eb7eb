"""Following a log through `pods/log` (sources/kubernetes/pod_logs.py, api.py's log_lines) against what a tenant
or the API may send: a line without end, a container not started yet, a refusal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from oomguard.exporter.events.api_log import ApiLogReader
from oomguard.exporter.sources.kubernetes.api import ApiClient, Connection
from oomguard.exporter.sources.kubernetes.pod_logs import MAX_LINE_BYTES, PodLogFollower

STAMP = "2026-12-05T12:00:01.000000001Z"


class Api:
    """pods/log of one container: `answer` says what comes next (lines to stream, or an HTTP status)."""

    def __init__(self) -> None:
        self.answer: int | bytes = 400
        self.requests: list[dict[str, str]] = []
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/llm/pods/vllm-0/log", self._log)
        self.app = app

    async def _log(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        if isinstance(self.answer, int):
            message = {400: 'container "vllm" in pod "vllm-0" is waiting to start: ContainerCreating',
                       403: 'pods "vllm-0" is forbidden: cannot get resource "pods/log"'}[self.answer]  # fmt: skip
            return web.json_response({"kind": "Status", "code": self.answer, "message": message}, status=self.answer)
        response = web.StreamResponse()
        await response.prepare(request)
        body = self.answer if request.query.get("previous") != "true" else b""
        for start in range(0, len(body), 1 << 20):
            await response.write(body[start : start + (1 << 20)])
        return response


@pytest.fixture
async def api(aiohttp_server) -> AsyncIterator[tuple[Api, ApiClient]]:
    stand_in = Api()
    served = await aiohttp_server(stand_in.app, shutdown_timeout=0.1)
    client = ApiClient(Connection(f"http://127.0.0.1:{served.port}"))
    yield stand_in, client
    await client.close()


async def test_a_line_without_end_is_cut_at_its_head_and_the_next_lines_read(api: tuple[Api, ApiClient]) -> None:
    stand_in, client = api
    endless = f"{STAMP} torch.OutOfMemoryError: CUDA out of memory ".encode() + b"x" * (32 << 20)
    lines = []
    stand_in.answer = endless + f"\n{STAMP} next\n".encode() + f"{STAMP} last, no newline".encode()
    async for line in client.log_lines("/api/v1/namespaces/llm/pods/vllm-0/log", {}, MAX_LINE_BYTES):
        lines.append(line)
    assert [len(line) for line in lines] == [MAX_LINE_BYTES, len(STAMP) + 5, len(STAMP) + 17]
    assert lines[0].startswith(f"{STAMP} torch.OutOfMemoryError")  # the head a pattern reads
    assert lines[1:] == [f"{STAMP} next", f"{STAMP} last, no newline"]


async def test_a_container_not_started_is_waited_for_and_a_refusal_counted(api: tuple[Api, ApiClient]) -> None:
    stand_in, client = api
    reader = ApiLogReader(from_start=True)
    follower = PodLogFollower(client, reader, namespace="llm", pod="vllm-0", container="vllm", retry_max_seconds=0.2)
    task = asyncio.ensure_future(follower.run())
    try:
        while len(stand_in.requests) < 4:  # the previous read and the stream, twice
            await asyncio.sleep(0.05)
        assert reader.stats.read_errors == 0  # a container waiting to start is nothing wrong
        stand_in.answer = 403
        while reader.stats.read_errors == 0:
            await asyncio.sleep(0.05)
        assert "forbidden" in reader.stats.last_error
        stand_in.answer = f"{STAMP} INFO started\n".encode()
        while not reader.stats.lines_read:
            await asyncio.sleep(0.05)
        assert reader.poll() == ["INFO started"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_stream_is_renewed_now_and_then_and_no_line_is_lost_or_repeated() -> None:
    """A connection that died without a word looks like a quiet engine: the stream is ended and asked again after
    stream_max_seconds, from where it was."""
    from oomguard.simulate.kubernetes_api import StandIn
    from tests.sources.kubernetes.k8s_harness import Server, free_port

    stand_in = StandIn()
    server = Server(stand_in.app(), "127.0.0.1", free_port())
    await server.start()
    client = ApiClient(Connection(f"http://127.0.0.1:{server.port}"))
    reader = ApiLogReader(from_start=True)
    follower = PodLogFollower(
        client, reader, namespace="llm", pod="vllm-0", container="vllm", retry_max_seconds=0.2,
        stream_max_seconds=0.3,
    )  # fmt: skip
    task = asyncio.ensure_future(follower.run())
    try:
        taken: list[str] = []
        for i in range(8):
            await stand_in.log("llm", "vllm-0", "vllm", f"line {i}", container_id="a" * 64)
            await asyncio.sleep(0.15)
            taken += reader.poll()
        while len(taken) < 8:
            await asyncio.sleep(0.05)
            taken += reader.poll()
        await asyncio.sleep(0.4)
        taken += reader.poll()
        assert taken == [f"line {i}" for i in range(8)]
        assert follower.streams >= 3 and reader.stats.read_errors == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await server.stop()
