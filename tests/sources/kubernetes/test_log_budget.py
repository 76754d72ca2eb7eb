"""The log streams' budget (sources/kubernetes/log_budget.py) and the followers over it (pod_logs.py): refused in
turn, counted, said once, and the logs of the followers without a stream still read whole, against the tests'
stand-in API."""

from __future__ import annotations

import asyncio
import logging

import pytest

from oomguard.exporter.events.api_log import ApiLogReader
from oomguard.exporter.sources.kubernetes.api import ApiClient, Connection
from oomguard.exporter.sources.kubernetes.log_budget import LogStreamBudget
from oomguard.exporter.sources.kubernetes.pod_logs import PodLogFollower
from oomguard.simulate.kubernetes_api import StandIn
from tests.sources.kubernetes.k8s_harness import Server, free_port, wait_for

CONTAINER_ID = "a" * 64


async def test_slots_go_to_those_waiting_oldest_first_and_a_refusal_is_counted_once_each() -> None:
    budget = LogStreamBudget(2, 1)
    first, second = budget.ask(), budget.ask()
    assert first.granted and second.granted and budget.counts().open == 2
    third, fourth = budget.ask(), budget.ask()
    assert not third.granted and not fourth.granted
    assert (budget.counts().waiting, budget.counts().refused_total) == (2, 2)
    first.release()  # handed to the oldest one waiting: open stays 2
    assert third.granted and not fourth.granted and budget.counts().open == 2
    assert await third.wait(0.0)
    # One that asks while others wait is queued behind them, even when a slot is free meanwhile.
    fourth.release()  # gives up its place (its pod gone)
    second.release()
    assert budget.counts().open == 1 and budget.counts().waiting == 0
    fifth = budget.ask()
    assert fifth.granted and budget.counts().refused_total == 2
    third.release()
    fifth.release()
    fifth.release()  # twice: nothing more given back
    assert budget.counts().open == 0


async def test_a_ticket_waits_until_handed_a_slot() -> None:
    budget = LogStreamBudget(1, 1)
    held = budget.ask()
    waiting = budget.ask()
    assert not await waiting.wait(0.05)
    asyncio.get_running_loop().call_later(0.05, held.release)
    assert await waiting.wait(5.0)


async def test_refusals_are_said_once_and_the_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="oomguard.exporter.sources.kubernetes.log_budget")
    budget = LogStreamBudget(1, 1, nofile=256)
    held = budget.ask()
    waiting = [budget.ask() for _ in range(50)]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "1 log streams open, the most allowed" in said[0] and "256 file descriptors" in said[0]
    # Turns: each stream that ends hands its slot over and its follower asks again behind the others (refused,
    # unsaid; here it is then stopped, its pod gone: unsaid too); the last one waiting handed a slot is no recovery.
    for ticket in [held, *waiting[:-1]]:
        ticket.release()
        budget.ask().release(stopping=True)
    assert len(caplog.records) == 1
    waiting[-1].release()  # the last stream ends with none waiting: said once
    assert [r.getMessage() for r in caplog.records][1:] == [
        "kubernetes: every followed log has its stream again (0 streams open; 100 refused meanwhile)"
    ]
    budget.ask().release()
    assert len(caplog.records) == 2


async def test_followers_over_the_budget_read_their_logs_whole_by_turns() -> None:
    """Six containers, two streams: every line of each reaches its reader once, in order, those of the four without
    a stream by turns of short reads; the refusals counted; when the streams end (their containers restarted), the
    slots go to those that waited."""
    api = StandIn()
    server = Server(api.app(), "127.0.0.1", free_port())
    await server.start()
    budget = LogStreamBudget(2, 1)
    client = ApiClient(Connection(f"http://127.0.0.1:{server.port}"), log_budget=budget)
    pods = [f"vllm-{i}" for i in range(6)]
    readers = {pod: ApiLogReader(from_start=True) for pod in pods}
    followers = {
        pod: PodLogFollower(
            client, readers[pod], namespace="llm", pod=pod, container="vllm", retry_max_seconds=0.2, turn_seconds=0.1
        )
        for pod in pods
    }
    for pod in pods:
        await api.log("llm", pod, "vllm", f"{pod} line 0", container_id=CONTAINER_ID)
    tasks = [asyncio.ensure_future(f.run()) for f in followers.values()]
    taken: dict[str, list[str]] = {pod: [] for pod in pods}
    most_open = 0

    def read_all() -> dict[str, list[str]]:
        nonlocal most_open
        most_open = max(most_open, budget.counts().open)
        for pod in pods:
            taken[pod] += readers[pod].poll()
        return taken

    try:
        for n in range(1, 4):
            for pod in pods:
                await api.log("llm", pod, "vllm", f"{pod} line {n}")
            await asyncio.sleep(0.05)
            read_all()
        want = {pod: [f"{pod} line {n}" for n in range(4)] for pod in pods}
        await wait_for(lambda: read_all() == want, "every line of every container")
        counts = budget.counts()
        assert (counts.open, counts.limit, counts.waiting, counts.refused_total) == (2, 2, 4, 4)
        assert most_open == 2
        streamed = sorted(pod for pod, f in followers.items() if f.streams)
        assert len(streamed) == 2 and all(followers[pod].turns for pod in pods if pod not in streamed)
        assert all(readers[pod].stats.read_errors == 0 for pod in pods)
        # The streamed containers restart: their streams end, their slots go to two that waited; the restarted
        # ones take turns now, and their new lives' lines still come.
        for pod in streamed:
            await api.end_container("llm", pod, "vllm")
            await api.log("llm", pod, "vllm", f"{pod} new life", container_id="b" * 64)
        await wait_for(lambda: len([f for f in followers.values() if f.streams]) >= 4, "the slots handed over")
        for pod in streamed:
            want[pod].append(f"{pod} new life")
        await wait_for(lambda: read_all() == want, "the new lives' lines")
        assert budget.counts().open == 2 and budget.counts().refused_total > 4
        await asyncio.sleep(0.3)  # more turns and streams: nothing comes twice
        assert read_all() == want
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await server.stop()
    assert budget.counts().open == 0 and budget.counts().waiting == 0
