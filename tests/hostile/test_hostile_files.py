"""Hostile files: the event state file, what is planted in a log folder, a configuration of huge values.

Each case goes through the real code path: the real EventRunner over real files in a temporary state_dir
and log folders, the real Runtime behind make_app for `/metrics`, the real CLI (`python -m oomguard
check-config`) in a subprocess. The table of cases is `CASES`; docs/faults.md prints it, and
`test_docs_table_is_current` keeps the two equal. Each case fails without the guard it holds. Waits are
on conditions with a deadline, never a bare sleep.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hostile_cases import Case, assert_documented
from support import REPO, Clock, settle

from oomguard.backtest.source import load_mapping
from oomguard.bundle.bundle_config import load_bundle_config
from oomguard.cli import main
from oomguard.common.bounded_yaml import MAX_ALIAS_NODES
from oomguard.drill.run import read_routing
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.events.runner import MAX_STATE_BYTES, STATE_FILE, EventRunner
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.sources.kubernetes.api import from_kubeconfig
from oomguard.exporter.web import make_app
from oomguard.exporter.web_config import load_web_config

CASES = [
    Case("state", "a state file of a wrong shape or type: `counts` a list, a count `\"x\"`, -3, `Infinity` or "
         "`1e999`, a last-event time `\"x\"`, a position a list, a follower's files a string, a cgroup's "
         "position `\"x\"`, an incident of a wrong shape, arrays nested 100,000 deep, a GPU's XID count, index, "
         "code or last time that is not one",
         "set aside whole as `events-state.json.corrupt`, `oomguard_event_state_read_errors_total` 1, an error "
         "logged; the start and every poll go on, counting afresh; nothing of it written back",
         "test_a_wrong_state_file_is_set_aside_whole"),
    Case("state", "a count `\"x\"` in the state file, then a scrape", "`/metrics` answers 200 (it answered "
         "500 for ever) with `oomguard_event_state_read_errors_total 1`",
         "test_a_wrong_count_does_not_break_metrics"),
    Case("state", "a state file over 64 MiB", "not read (its size is checked first): set aside, counted",
         "test_a_huge_state_file_is_not_read"),
    Case("state", "a FIFO as the state file", "opened non-blocking, refused as not a regular file: the start "
         "does not hang", "test_a_fifo_state_file_does_not_hang_the_start"),
    Case("logs", "a symbolic link planted in a log folder (`app.log.evil -> secret`), or a linked directory "
         "matched by a wildcard", "skipped, logged once naming the path and `follow_symlinks`, "
         "`event_source_read_errors_total` +1; followed where the target sets `follow_symlinks: true`",
         "test_a_planted_symlink_is_not_read"),
    Case("config", "a 10 MB string as a value or a key of the configuration", "the error quotes its first "
         "200 characters and its length: `... (10000000 characters)`", "test_a_huge_config_string_gives_a_short_error"),
    Case("config", "a YAML alias bomb (billion laughs: 6 levels of 9 aliases, 387 bytes) as `serve --config`, the "
         "bundle configuration, the web configuration, `backtest --mapping` or the kubeconfig (one of 9 levels, "
         "under 500 bytes, took 83 s and 3 GB as a mapping, 38 s and 380 MB as a configuration)",
         "refused before anything is built of it "
         "(the nodes its aliases add counted on the composed document, at most 100,000): one line naming the file, "
         "`an alias bomb` and the limit; `serve`, `check-config` exit 1, `backtest` 2",
         "test_a_yaml_alias_bomb_is_refused_before_it_is_built"),
    Case("config", "an alias inside the node it names (`targets: &a [*a]`) in any of those files",
         "refused the same way: `an alias refers to the node that holds it`",
         "test_a_yaml_alias_inside_its_anchor_is_refused"),
    Case("config", "`drill --alertmanager-config` given a FIFO, a file over 1 MiB, an alias bomb or YAML with no "
         "`route:` mapping", "one line naming the file and the fix, exit 2, before Prometheus or Alertmanager start "
         "(a FIFO was waited on for ever, the bomb and a list ended in tracebacks)",
         "test_the_drill_refuses_a_hostile_alertmanager_config_in_one_line"),
]  # fmt: skip


def test_docs_table_is_current() -> None:
    assert_documented(CASES, globals())


OOM = [
    "ERROR 05-01 12:00:0{i} [engine.py:1] Traceback (most recent call last):",
    "ERROR 05-01 12:00:0{i} [engine.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
]


def oom(path: Path, i: int = 0) -> None:
    with path.open("a") as f:
        f.write("".join(line.format(i=i) + "\n" for line in OOM))


# -- the state file ---------------------------------------------------------------------------------------------
def runner(tmp_path: Path, clock: Clock | None = None, **target: object) -> EventRunner:
    """A target "a" with a log (a.log) and a cgroup (a fake memory.events), its state in tmp_path/state."""
    (tmp_path / "a.log").touch()
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir(exist_ok=True)
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "events": {"kernel_log": False, "quiet_seconds": 5},
            "targets": [
                {"name": "a", "url": "http://127.0.0.1:8000", "logs": [str(tmp_path / "a.log")],
                 "cgroup": str(cgroup), **target}
            ],
        },
    )  # fmt: skip
    return EventRunner(config, clock=clock or Clock())


def write_state(tmp_path: Path, text: str) -> Path:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / STATE_FILE).write_text(text)
    return state / STATE_FILE


def follower_key(tmp_path: Path) -> str:
    return f"a|file:{tmp_path / 'a.log'}"


WRONG_STATES: dict[str, Callable[[Path], str]] = {
    "counts a list": lambda _: '{"counts": []}',
    "a string count": lambda _: '{"counts": {"ctl": {"total": {"cuda_oom": "x"}}}}',
    "a negative count": lambda _: '{"counts": {"a": {"total": {"cuda_oom": -3}}}}',
    "an infinite count": lambda _: '{"counts": {"a": {"total": {"cuda_oom": Infinity}}}}',
    "a count too large for a float": lambda _: '{"counts": {"a": {"total": {"cuda_oom": 1e999}}}}',
    "a last time a string": lambda _: '{"counts": {"a": {"total": {"cuda_oom": 1}, "last": {"cuda_oom": "x"}}}}',
    "a position a list": lambda p: json.dumps({"positions": {follower_key(p): [1, 2]}}),
    "positions a list": lambda _: '{"positions": [1]}',
    "a follower's files a string": lambda p: json.dumps({"positions": {follower_key(p): {"version": 1,
                                                                                        "files": "zz"}}}),
    "a follower's offset a string": lambda p: json.dumps({"positions": {follower_key(p): {
        "version": 1, "files": [{"dev": 1, "ino": 2, "path": "x", "offset": "far"}]}}}),
    "a cgroup position a string": lambda p: json.dumps({"positions": {f"a|cgroup:{p / 'cgroup'}": {
        "oom_kill": "x"}}}),
    "a cgroup position a list": lambda p: json.dumps({"positions": {f"a|cgroup:{p / 'cgroup'}": [3]}}),
    "an incident of a wrong shape": lambda p: json.dumps({"incidents": {follower_key(p): {"open": 5}}}),
    "arrays nested 100,000 deep": lambda _: "[" * 100_000 + "]" * 100_000,
    "a GPU's XID count a string": lambda _: '{"gpu_counts": {"xid": {"0": {"total": {"79": "x"}, "last": 5}}}}',
    "a GPU index not a number": lambda _: '{"gpu_counts": {"xid": {"zero": {"total": {"79": 1}, "last": 5}}}}',
    "an XID code in other digits": lambda _: '{"gpu_counts": {"xid": {"0": {"total": {"\u00b2": 1}, "last": 5}}}}',
    "a GPU's last XID time a string": lambda _: '{"gpu_counts": {"xid": {"0": {"total": {"79": 1}, "last": "x"}}}}',
}  # fmt: skip


@pytest.mark.parametrize("name", list(WRONG_STATES))
def test_a_wrong_state_file_is_set_aside_whole(tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture) -> None:
    text = WRONG_STATES[name](tmp_path)
    path = write_state(tmp_path, text)
    clock = Clock()
    with caplog.at_level(logging.ERROR, "oomguard.exporter.events.runner"):
        r = runner(tmp_path, clock)
    assert r.state_read_errors == 1
    assert "cannot read" in caplog.text and ".corrupt" in caplog.text
    assert path.with_name(STATE_FILE + ".corrupt").read_text() == text  # kept aside as it was
    assert r.counts == {}  # nothing of it trusted
    # Every poll goes on: the log and the cgroup are read, no source raises, and counting starts afresh.
    r.poll()
    oom(tmp_path / "a.log")
    settle(r, clock)
    assert r.counts["a"].total == {"cuda_oom": 1}
    assert sum(h.read_errors for h in r.health()) == 0
    r.close()
    saved = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} written back"))
    assert saved["counts"] == {"a": {"total": {"cuda_oom": 1}, "last": {"cuda_oom": 1000.0}}}  # afresh


async def test_a_wrong_count_does_not_break_metrics(aiohttp_client, tmp_path: Path) -> None:
    write_state(tmp_path, '{"counts": {"ctl": {"total": {"cuda_oom": "x"}}}}')
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "nvml": {"enabled": False},
            "events": {"kernel_log": False, "xid": False},
            "trend": {"enabled": False},
            "targets": [{"name": "ctl", "url": "http://127.0.0.1:9", "local_process": "no"}],  # nothing listens
        },
    )
    client = await aiohttp_client(make_app(Runtime(config)))
    for _ in range(2):  # not only the first scrape
        response = await client.get("/metrics")
        assert response.status == 200, await response.text()
        body = await response.text()
        assert "oomguard_event_state_read_errors_total 1" in body
        assert 'oomguard_target_events_total{target="ctl",kind="cuda_oom"}' not in body  # the bad count is gone


def test_a_huge_state_file_is_not_read(tmp_path: Path) -> None:
    # Valid JSON, padded past the cap: the code before read it whole (and accepted it).
    path = write_state(tmp_path, '{"counts": {"a": {"total": {"cuda_oom": 5}}}}')
    with path.open("a") as f:
        f.write(" " * MAX_STATE_BYTES)
    tracemalloc.start()
    try:
        r = runner(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_STATE_BYTES // 4, f"{peak} bytes allocated while reading the state file"
    assert r.state_read_errors == 1 and r.counts == {}
    assert path.with_name(STATE_FILE + ".corrupt").stat().st_size > MAX_STATE_BYTES
    r.close()


def test_a_fifo_state_file_does_not_hang_the_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    fifo = state / STATE_FILE
    os.mkfifo(fifo)
    made: list[EventRunner] = []
    thread = threading.Thread(target=lambda: made.append(runner(tmp_path)), daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # release the reader blocked in open() or read(): a writer that closes at once
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the start hung on a FIFO as the state file")
    (r,) = made
    assert r.state_read_errors == 1
    assert not fifo.exists() and fifo.with_name(STATE_FILE + ".corrupt").is_fifo()
    r.close()
    assert json.loads(fifo.read_text())["counts"] == {}


# -- logs ------------------------------------------------------------------------------------------------------
def symlink_runner(tmp_path: Path, clock: Clock, pattern: str, **target: object) -> EventRunner:
    config = load_config(
        None,
        {
            "events": {"kernel_log": False, "quiet_seconds": 5, "from_start": True},
            "targets": [{"name": "a", "url": "http://127.0.0.1:8000", "logs": [pattern], **target}],
        },
    )
    return EventRunner(config, clock=clock)


@pytest.mark.parametrize("planted", ["file", "directory"])
@pytest.mark.parametrize("follow", [False, True])
def test_a_planted_symlink_is_not_read(
    tmp_path: Path, planted: str, follow: bool, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "secret"  # what the link points to: a file the exporter must not read
    secret.mkdir()
    oom(secret / "app.log")
    logs = tmp_path / "logs"
    (logs / "engine").mkdir(parents=True)
    (logs / "engine" / "app.log").touch()
    if planted == "file":
        (logs / "engine" / "app.log.evil").symlink_to(secret / "app.log")
        pattern, link = logs / "engine" / "app.log*", logs / "engine" / "app.log.evil"
    else:
        (logs / "evil").symlink_to(secret)
        pattern, link = logs / "*" / "app.log", logs / "evil"
    clock = Clock()

    def skipped() -> list[str]:
        return [
            r.message
            for r in caplog.records
            if r.name == "oomguard.exporter.events.file_follower" and str(link) in r.message
        ]

    with caplog.at_level(logging.WARNING, "oomguard.exporter.events"):
        r = symlink_runner(tmp_path, clock, str(pattern), follow_symlinks=follow)
        for _ in range(3):
            settle(r, clock)
    counted = r.counts["a"].total.get("cuda_oom", 0) if "a" in r.counts else 0
    errors = sum(h.read_errors for h in r.health())
    if follow:
        assert (counted, errors) == (1, 0)
    else:
        assert (counted, errors) == (0, 1)
        assert len(skipped()) == 1 and "follow_symlinks" in skipped()[0], caplog.messages  # once, not per poll
        oom(logs / "engine" / "app.log")  # the real log is read all the same
        settle(r, clock)
        assert r.counts["a"].total == {"cuda_oom": 1}
    r.close()


# -- configuration -----------------------------------------------------------------------------------------------
BIG = 10_000_000


@pytest.mark.parametrize("where", ["value", "key"])
def test_a_huge_config_string_gives_a_short_error(tmp_path: Path, where: str) -> None:
    target: dict[str, object] = {"url": "http://127.0.0.1:8000"}
    if where == "value":
        target["engine"] = "x" * BIG
    else:
        target["x" * BIG] = 1
    path = tmp_path / "oomguard.yaml"
    path.write_text(yaml.safe_dump({"targets": [target]}, width=2**31))
    result = subprocess.run(
        [sys.executable, "-m", "oomguard", "check-config", str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert len(result.stdout) + len(result.stderr) < 2000, f"{len(result.stderr)} characters of error"
    assert f"... ({BIG} characters)" in result.stderr
    assert "targets[0]" in result.stderr
    if where == "value":
        assert "known engines: vllm" in result.stderr  # the fix is still named


# -- YAML alias bombs ------------------------------------------------------------------------------------------
LAUGH = "laugh-2b7e"  # the bomb's one string: a document holding it was built into Python objects


def alias_bomb(levels: int = 6, width: int = 9) -> str:
    """`levels` lists of `width` aliases of the list before: width^levels strings from a few hundred bytes (9^6 =
    531,441 from 387 bytes, over MAX_ALIAS_NODES; 9 levels are 387 million). Placed (BOMBED) where each file's
    reader walks whatever it finds before its error (a list where a mapping or text belongs)."""
    lines = [f"l0: &l0 [{', '.join([LAUGH] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# Each file a user or a tenant gives oomguard that is YAML: where the bomb goes in it, and its reader.
BOMBED = {
    "serve --config": ("targets: *l5\n", lambda path: load_config(path)),
    "bundle configuration": ("alerts: *l5\n", lambda path: load_bundle_config(path)),
    "web configuration": ("basic_auth_users: *l5\n", lambda path: load_web_config(path)),
    "backtest --mapping": ("gpu: {used_bytes: *l5}\n", lambda path: load_mapping("dcgm", path)),
    "kubeconfig": ("current-context: *l5\ncontexts: *l5\n", lambda path: from_kubeconfig(path)),
    "drill --alertmanager-config": ("route: {routes: *l5}\n", lambda path: read_routing(path)),
}


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first line of each YAML document that a loader built into Python objects, in the test."""
    made: list[str] = []
    construct = yaml.constructor.BaseConstructor.construct_document

    def counting(self: yaml.constructor.BaseConstructor, node: yaml.Node) -> object:
        made.append(node.start_mark.buffer.split("\n", 1)[0] if node.start_mark.buffer else "")
        return construct(self, node)

    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_document", counting)
    return made


def refusal(text: str, reader: Callable[[Path], object], tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    with pytest.raises(Exception) as raised:  # each reader's own error: ConfigError, BacktestError, ApiError
        reader(path)
    assert not isinstance(raised.value, RecursionError | MemoryError | AttributeError | TypeError), raised.value
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return path, message


@pytest.mark.parametrize("where", list(BOMBED))
def test_a_yaml_alias_bomb_is_refused_before_it_is_built(where: str, tmp_path: Path, built: list[str]) -> None:
    placed, reader = BOMBED[where]
    _, message = refusal(alias_bomb() + placed, reader, tmp_path)
    assert "an alias bomb" in message and f"{MAX_ALIAS_NODES:,}" in message, message
    assert not [line for line in built if LAUGH in line], "the bomb was built before it was refused"


@pytest.mark.parametrize("where", list(BOMBED))
def test_a_yaml_alias_inside_its_anchor_is_refused(where: str, tmp_path: Path, built: list[str]) -> None:
    placed, reader = BOMBED[where]
    text = f"first: {LAUGH}\n" + placed.replace("*l5", "&l5 [*l5]", 1)
    _, message = refusal(text, reader, tmp_path)
    assert "an alias refers to the node that holds it" in message, message
    assert not [line for line in built if LAUGH in line], "the document was built before it was refused"


def test_the_commands_refuse_an_alias_bomb_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a user sees: one line on stderr naming the file, and the exit status; nothing started."""
    config, web = tmp_path / "oomguard.yaml", tmp_path / "web-config.yml"
    config.write_text(alias_bomb() + BOMBED["serve --config"][0])
    web.write_text(alias_bomb() + BOMBED["web configuration"][0])
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(alias_bomb() + BOMBED["backtest --mapping"][0])
    runs = [
        (config, 1, ["check-config", str(config)]),
        (config, 1, ["serve", "--config", str(config)]),
        (web, 1, ["serve", "--simulate", "steady", "--web.config.file", str(web)]),
        (mapping, 2, ["backtest", "--prometheus", "http://127.0.0.1:9", "--start", "1700000000",
                      "--end", "1700003600", "--mapping", str(mapping)]),
    ]  # fmt: skip
    for path, status, argv in runs:
        assert main(argv) == status, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(path) in err and "an alias bomb" in err, (argv, err)


def test_the_drill_refuses_a_hostile_alertmanager_config_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo, big, bomb, listed = (tmp_path / name for name in ("fifo.yml", "big.yml", "bomb.yml", "list.yml"))
    os.mkfifo(fifo)
    big.write_text("route: {}\n" + "# " + "x" * (2 * 1024**2) + "\n")
    bomb.write_text(alias_bomb() + BOMBED["drill --alertmanager-config"][0])
    listed.write_text("- route\n- receivers\n")
    for path, said in ((fifo, "not a regular file"), (big, "over the limit"), (bomb, "an alias bomb"),
                       (listed, "no `route:` mapping")):  # fmt: skip
        assert main(["drill", "--scenario", "incident", "--alertmanager-config", str(path)]) == 2, path
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(path) in err and said in err, err
