"""Configuration: the example loads, and every mistake is refused at start with the key and the fix."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from support import REPO

from oomguard.cli import main
from oomguard.exporter.config import ConfigError
from oomguard.simulate.checks import load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "oomguard.yaml"
    path.write_text(text)
    return path


def test_example_in_deploy_loads() -> None:
    config = load_config(REPO / "deploy" / "oomguard.yaml")
    assert [t.label for t in config.targets] == ["llama-70b", "qwen-7b"]
    assert config.targets[0].gpus == (0, 1, 2, 3)
    assert config.target_timeout(config.targets[0]) == 3
    assert config.target_timeout(config.targets[1]) == 2
    assert config.targets[1].is_local


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config.web.listen_address == ":9847"
    assert config.nvml.enabled and config.targets == ()


def test_name_defaults_to_host_and_port() -> None:
    config = load_config(None, {"targets": [{"url": "http://gpu-node-3:8000/"}]})
    assert config.targets[0].label == "gpu-node-3:8000"
    assert config.targets[0].url == "http://gpu-node-3:8000"
    assert not config.targets[0].is_local


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "targets:\n  - url: htp://x:8000\n",
            r"targets\[0\]\.url: 'htp://x:8000' is not an http\(s\) URL.*e\.g\. http://",
        ),
        ("targets:\n  - url: http://x:8000/metrics\n", r"has a path \(/metrics\); give the base URL only"),
        ("targets:\n  - url: http://x:99999\n", r"bad port"),
        (
            "targets:\n  - url: http://x:8000\n    timout_seconds: 3\n",
            r"targets\[0\]\.timout_seconds: unknown key; did you mean 'timeout_seconds'\?",
        ),
        (
            "nvml:\n  timeout_seconds: -1\n",
            r"nvml\.timeout_seconds: must be greater than 0; write a number above 0 in seconds, e\.g\. 5",
        ),
        ("scrape:\n  max_body_bytes: 0\n", r"scrape\.max_body_bytes: must be greater than 0; write a number above 0"),
        ("targets:\n  - url: http://x:8000\n    engine: ollama\n", r"unknown engine 'ollama'; known engines: vllm"),
        ("targets:\n  - url: http://x:8000\n    gpus: [-1]\n", r"GPU indices are 0 or more"),
        (
            "targets:\n  - {url: 'http://a:1', name: x}\n  - {url: 'http://b:1', name: x}\n",
            r"two targets are named 'x'",
        ),
        ("web:\n  listen_address: 9847\n", r"web\.listen_address"),
        ("web:\n  listen_address: 'localhost'\n", r"is not HOST:PORT"),
        ("tragets: []\n", r"tragets: unknown key; did you mean 'targets'\?"),
        ("targets: [\n", r"not valid YAML"),
        ("- just a list\n", r"top level must be a mapping"),
    ],
)
def test_mistakes_are_refused_with_key_and_fix(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration file"):
        load_config(tmp_path / "nope.yaml")


def test_a_file_not_in_utf8_is_refused_with_the_byte_and_the_fix(tmp_path: Path) -> None:
    """Bug found by tests/fuzz: a file saved as Latin-1 ended in a raw UnicodeDecodeError traceback."""
    path = tmp_path / "oomguard.yaml"
    path.write_bytes("targets:\n  - url: http://café:8000\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}: the configuration file is not UTF-8 text: byte 28 (line 2) is 0xe9 (invalid continuation byte); "
        "save it as UTF-8"
    )


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(REPO / "deploy" / "oomguard.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid. It will watch:" in out
    assert "engines: llama-70b (vllm at http://127.0.0.1:8000, log: /var/log/vllm/llama-70b*.log, cgroup " in out
    # Not a cgroup on this machine: said, with what it means (tests/events/test_kernel_kills.py: v1 and v2).
    assert "vllm-llama.service: no memory.events (v2) or memory.oom_control (v1) there yet" in out
    # Valid, but its log pattern matches nothing here: a warning naming it, not an error.
    assert "warning: logs pattern '/var/log/vllm/llama-70b*.log' of llama-70b matches no file now" in out
    assert main(["check-config", str(write(tmp_path, "targets:\n  - url: ftp://x\n"))]) == 1
    assert "targets[0].url" in capsys.readouterr().err


def test_check_config_says_what_an_empty_file_watches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty file is valid, and check-config says so in words: the local engines are discovered; with discovery
    off, no engine, only GPUs, and how to add one."""
    assert main(["check-config", str(write(tmp_path, ""))]) == 0
    out = capsys.readouterr().out
    assert "engines: no targets configured: local engines are discovered by their command lines" in out
    assert "state: in memory only (no state_dir)" in out
    assert main(["check-config", str(write(tmp_path, "discovery:\n  local: off\n"))]) == 0
    out = capsys.readouterr().out
    assert "engines: none. No targets:, no kubernetes: block and discovery.local is off, so only the GPUs" in out


def test_precedence_flag_over_environment_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oomguard import cli

    seen = {}
    monkeypatch.setattr(cli, "serve", lambda config, web_config_file=None: seen.setdefault("config", config) and 0)
    path = write(tmp_path, "web:\n  listen_address: ':1111'\nnvml:\n  enabled: true\n")
    monkeypatch.setenv("OOMGUARD_WEB_LISTEN_ADDRESS", ":2222")
    monkeypatch.setenv("OOMGUARD_COLLECTOR_NVML", "false")
    main(["serve", "--config", str(path)])
    assert seen.pop("config").web.listen_address == ":2222"
    main(["serve", "--config", str(path), "--web.listen-address", ":3333", "--collector.nvml"])
    config = seen.pop("config")
    assert config.web.listen_address == ":3333" and config.nvml.enabled
    monkeypatch.setenv("OOMGUARD_CONFIG", str(path))
    monkeypatch.delenv("OOMGUARD_WEB_LISTEN_ADDRESS")
    main(["serve"])
    assert seen.pop("config").web.listen_address == ":1111"


def test_an_override_under_a_key_the_file_leaves_empty_is_refused_with_the_key(tmp_path: Path) -> None:
    """Bug found by tests/fuzz: `web:` left empty in the file (its keys commented out) with --web.listen-address
    or $OOMGUARD_WEB_LISTEN_ADDRESS set ended in a raw TypeError traceback."""
    for text in ("web:\n", "web: 9847\n"):
        with pytest.raises(ConfigError, match=r"web: must be a mapping"):
            load_config(write(tmp_path, text), {"web.listen_address": ":1234"})


@pytest.mark.parametrize("regex", ["a{4294967296}", "(" * 2000 + ")" * 2000])
def test_a_pattern_too_large_to_compile_is_refused_with_its_key(tmp_path: Path, regex: str) -> None:
    """Bug found by tests/fuzz: a regex whose repeat count overflows, or nested too deep, ended in a raw
    OverflowError or RecursionError traceback instead of a configuration error."""
    text = f"events:\n  patterns:\n    - kind: cuda_oom\n      regex: '{regex}'\n"
    with pytest.raises(ConfigError, match=r"events\.patterns\[0\]: pattern .* is not a valid regular expression"):
        load_config(write(tmp_path, text))


def test_yaml_nested_too_deep_is_refused_with_the_file(tmp_path: Path) -> None:
    """Bug found by tests/fuzz: a document nested ~500 levels deep ([[[[...) ended in a raw RecursionError
    traceback from the YAML parser."""
    path = write(tmp_path, "targets: " + "[" * 1000 + "]" * 1000 + "\n")
    with pytest.raises(ConfigError, match=r"oomguard\.yaml: not valid YAML: nested hundreds of levels deep"):
        load_config(path)


def test_bad_environment_value_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OOMGUARD_WEB_LISTEN_ADDRESS", "nowhere")
    assert main(["serve"]) == 1
    assert "web.listen_address" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        ("OOMGUARD_SIMULATE_TIME_SCALE", "abc",
         "$OOMGUARD_SIMULATE_TIME_SCALE=abc: simulation.time_scale must be a number"),
        ("OOMGUARD_SIMULATE_GPUS", "0", "$OOMGUARD_SIMULATE_GPUS=0: simulation.gpus must be at least 1"),
        ("OOMGUARD_SIMULATE", "hot-stedy", "$OOMGUARD_SIMULATE=hot-stedy: simulation.scenario: unknown scenario "
         "'hot-stedy'; did you mean 'hot-steady'?"),
    ],
)  # fmt: skip
def test_a_bad_environment_value_names_its_variable(
    variable: str, value: str, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An environment variable's value is no key of any file: its error names the variable and what it holds,
    then the key (the key alone, which no file of the user's holds, would leave them to find what set it)."""
    monkeypatch.setenv(variable, value)
    if variable != "OOMGUARD_SIMULATE":
        monkeypatch.setenv("OOMGUARD_SIMULATE", "incident")
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert f"  {line}" in err, err


def test_a_flag_over_a_bad_environment_value_wins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the flag gave is not blamed on the variable the flag overrode; a file's value keeps its key."""
    from oomguard import cli

    monkeypatch.setattr(cli, "serve", lambda config, web_config_file=None: 0)
    monkeypatch.setenv("OOMGUARD_SIMULATE_TIME_SCALE", "abc")
    assert main(["serve", "--simulate", "incident", "--simulate.time-scale", "3"]) == 0
    with pytest.raises(ConfigError) as refused:
        load_config(None, {"simulation": {"scenario": "incident", "time_scale": "abc"}})
    assert "  simulation.time_scale: must be a number (got 'abc')" in str(refused.value)


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), 0])
def test_a_time_scale_that_is_no_clock_is_refused_naming_the_key(scale: float) -> None:
    """An infinite scale would judge every duration as zero: refused where it is read, not when the runtime starts."""
    with pytest.raises(ConfigError, match=r"simulation\.time_scale"):
        load_config(None, {"simulation": {"scenario": "incident", "time_scale": scale}})


def test_the_kubernetes_block_takes_its_node_from_the_downward_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    path = write(tmp_path, "kubernetes:\n  port: http\n  label_selector: app.kubernetes.io/name=vllm\n")
    k8s = load_config(path).kubernetes
    assert k8s is not None and (k8s.node_name, k8s.port, k8s.engine, k8s.namespaces) == (
        "gpu-node-1",
        "http",
        "vllm",
        (),
    )
    assert main(["check-config", str(path)]) == 0
    assert "pods of node gpu-node-1 matching app.kubernetes.io/name=vllm, port http" in capsys.readouterr().out
    assert load_config(write(tmp_path, "kubernetes: {port: 8000, node_name: n2}\n")).kubernetes.node_name == "n2"  # type: ignore[union-attr]


def test_the_cluster_mode_needs_no_node_and_says_what_it_watches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    path = write(tmp_path, "kubernetes: {port: http, scope: cluster}\ndcgm: {discover: true, namespaces: [gpu-ops]}\n")
    config = load_config(path)
    assert config.local_node == "" and config.dcgm is not None and config.dcgm.port == 9400
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "pods of every node matching any label, port http" in out and "through the API (pods/log)" in out
    assert "GPUs: every node's, from its dcgm-exporter pod (app=nvidia-dcgm-exporter in gpu-ops" in out
    # A node agent that may not read NVML reads its node's dcgm-exporter.
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    path = write(tmp_path, "dcgm: {urls: ['http://127.0.0.1:9400/metrics']}\n")
    assert load_config(path).local_node == "gpu-node-1"
    assert main(["check-config", str(path)]) == 0
    assert "GPUs: this node's, from dcgm-exporter at http://127.0.0.1:9400/metrics" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kubernetes: {port: http}\n", "node_name is empty and so is $NODE_NAME"),
        ("kubernetes: {port: 70000, node_name: n}\n", "a port number is 1-65535"),
        ("kubernetes: {port: http, node_name: n, engine: vllmm}\n", "unknown engine 'vllmm'"),
        ("kubernetes: {node_name: n}\n", "kubernetes.port: is required: add it"),
        ("kubernetes: {port: http, scope: cluster}\n", "add dcgm: {discover: true} to read every node's GPUs"),
        ("kubernetes: {port: http, scope: region}\n", "kubernetes.scope"),
        (
            "kubernetes: {port: http, node_name: n}\ndcgm: {discover: true, namespaces: [gpu-operator]}\n",
            "it needs kubernetes.scope: cluster",
        ),
        ("kubernetes: {port: http, scope: cluster}\ndcgm: {discover: true}\n", "dcgm.namespaces: is empty"),
        (
            "kubernetes: {port: http, scope: cluster}\ndcgm: {discover: true, namespaces: [gpu], daemonsets: []}\n",
            "dcgm.daemonsets: is empty",
        ),
        ("dcgm: {}\n", "give dcgm-exporter's urls (a node agent) or discover: true (the cluster mode)"),
        ("dcgm: {urls: ['gpu-node:9400']}\n", "is not an http(s) URL"),
    ],
)
def test_a_bad_kubernetes_block_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write(tmp_path, text))


def test_a_whole_section_is_never_echoed_back(tmp_path: Path) -> None:
    """A check of the whole file (two targets of one name) names the mistake, not the whole configuration."""
    path = tmp_path / "oomguard.yaml"
    path.write_text("targets:\n  - {url: 'http://a:1', name: x}\n  - {url: 'http://b:1', name: x}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    lines = str(error.value).splitlines()[1:]
    assert lines == ["  (top level): two targets are named 'x'; give each a distinct `name:`"]


def test_check_config_warns_of_a_log_pattern_that_matches_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "vllm.log").write_text("")
    (tmp_path / "logs" / "link.log").symlink_to(tmp_path / "logs" / "vllm.log")
    good, typo, links = tmp_path / "logs" / "*.log", tmp_path / "logz" / "*.log", tmp_path / "logs" / "link*.log"
    body = (
        "targets:\n"
        f"  - {{url: 'http://127.0.0.1:8000', name: good, logs: ['{good}']}}\n"
        f"  - {{url: 'http://127.0.0.1:8001', name: typo, logs: ['{typo}']}}\n"
        f"  - {{url: 'http://127.0.0.1:8002', name: links, logs: ['{links}']}}\n"
        f"  - {{url: 'http://127.0.0.1:8003', name: followed, logs: ['{links}'], follow_symlinks: true}}\n"
    )
    assert main(["check-config", str(write(tmp_path, body))]) == 0  # valid: a warning, not an error
    warned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert warned == [
        f"warning: logs pattern '{typo}' of typo matches no file now: if it is not the engine's log (a typo?), its "
        "OOMs are never counted; while it runs, oomguard_event_source_files says how many files it follows",
        f"warning: logs pattern '{links}' of links matches only symbolic links (1), which are skipped "
        "(follow_symlinks: false): if it is not the engine's log (a typo?), its OOMs are never counted; while it "
        "runs, oomguard_event_source_files says how many files it follows",
    ]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("targets:\n  - url: http://127.0.0.1:8000\n    gpus: zero\n",
         "targets[0].gpus: must be a list: one '- item' line each, or [a, b] (got 'zero')"),
        ("targets: 5\n", "targets: must be a list: one '- item' line each, or [a, b] (got 5)"),
        ("nvml: yes-please\n", "nvml: must be a mapping: 'key: value' lines indented under it (got 'yes-please')"),
        ("targets:\n  - name: x\n", "targets[0].url: is required: add it"),
        ("targets:\n  - url: 5\n", "targets[0].url: must be text (in quotes where YAML would read a number"),
        ("targets:\n  - url: http://127.0.0.1:8000\n    gpus: [1.5]\n",
         "targets[0].gpus[0]: must be a whole number (got 1.5)"),
    ],
)  # fmt: skip
def test_check_config_says_each_error_in_its_own_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: str
) -> None:
    """What to write, in oomguard's words: never pydantic's ("Input should be a valid tuple", "Field required")."""
    assert main(["check-config", str(write(tmp_path, text))]) == 1
    err = capsys.readouterr().err
    assert f"\n  {line}" in err, err
    assert "Input should" not in err and "Field required" not in err and "valid tuple" not in err, err


def test_every_subcommand_help_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    """`oomguard COMMAND --help` begins with what the command does (the line of `oomguard --help`), and each
    argument has a help text: check-config's `file` too."""
    from oomguard.cli import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in commands.choices:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        page = capsys.readouterr().out
        summary = next(c.help for c in commands._choices_actions if c.dest == name)
        assert summary and summary in " ".join(page.split()), (name, page)
    main_page = " ".join(_parser().format_help().split())
    assert all(c.help in main_page for c in commands._choices_actions)
    check = commands.choices["check-config"]
    assert all(a.help for a in check._actions), [a.dest for a in check._actions if not a.help]


def test_the_simulation_and_the_drill_share_their_scenarios_names(capsys: pytest.CaptureFixture[str]) -> None:
    """One vocabulary: every drill scenario's name runs with `serve --simulate` as the simulation and engine the
    drill runs (`hot-steady` and `sglang-incident` were refused there); a simulation the drill has not is
    listed with why; the old names of the simulation still load, as the same scenario, and `serve --help` lists
    the new ones only."""
    from oomguard.drill.scenarios import SCENARIOS as DRILLS
    from oomguard.simulate.scenarios import ALIASES, NAMES, SCENARIOS, SIMULATION_ONLY

    for name, drill in DRILLS.items():
        simulation = load_config(None, {"simulation": {"scenario": name}}).simulation
        assert (simulation.scenario, simulation.engine) == (drill.simulation, drill.engine), name
        assert name in NAMES
    for name in NAMES:
        assert (name in DRILLS) != (name in SIMULATION_ONLY), name
    for old, new in ALIASES.items():
        assert old not in NAMES and SCENARIOS[old] is SCENARIOS[new]
        assert load_config(None, {"simulation": {"scenario": old}}).simulation.scenario == old
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    page = " ".join(re.sub(r"-\n\s*", "-", capsys.readouterr().out).split())  # argparse wraps at hyphens
    assert ", ".join(NAMES) in page and "overcommit," not in page.split("(the drill's names")[0]


def test_serve_and_the_drill_refuse_an_unknown_scenario_alike(capsys: pytest.CaptureFixture[str]) -> None:
    """Both commands: "unknown scenario 'X'", the closest name, and the list (the drill printed its list alone)."""
    from oomguard.drill.scenarios import SCENARIOS as DRILLS
    from oomguard.simulate.scenarios import NAMES

    assert main(["serve", "--simulate", "incidnet"]) == 1
    said = capsys.readouterr().err
    assert f"unknown scenario 'incidnet'; did you mean 'incident'? choose one of: {', '.join(NAMES)}" in said, said
    assert main(["drill", "--scenario", "incidnet"]) == 2
    said, listed = capsys.readouterr().err, ", ".join(DRILLS)
    assert said == f"oomguard drill: unknown scenario 'incidnet'; did you mean 'incident'? choose one of: {listed}\n"
    assert main(["drill", "--scenario", "hot-stedy"]) == 2
    assert "did you mean 'hot-steady'?" in capsys.readouterr().err


def test_a_simulation_the_drill_has_not_is_refused_with_why_and_what_to_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from oomguard.drill.scenarios import SCENARIOS as DRILLS
    from oomguard.drill.scenarios import find

    for name in ("incident-quick", "overcommit-quick"):  # the old name of the same
        assert main(["drill", "--scenario", name]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("oomguard drill: unknown scenario 'incident-quick': it is the simulation's alone")
        assert "'sglang-incident'" in line and "`oomguard serve --simulate incident-quick`" in line
    # The simulation's old names reach the drill of the same scenario.
    assert find("steady") is DRILLS["hot-steady"] and find("leak") is DRILLS["slow-leak"]


def test_a_scenario_that_names_its_engine_refuses_another_engine(tmp_path: Path) -> None:
    path = write(tmp_path, "simulation:\n  scenario: sglang-incident\n  engine: vllm\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "scenario 'sglang-incident' runs on the sglang simulator, not engine 'vllm'" in str(refused.value)
    assert "write scenario: incident-quick" in str(refused.value)
    same = load_config(write(tmp_path, "simulation:\n  scenario: sglang-incident\n  engine: sglang\n"))
    assert (same.simulation.scenario, same.simulation.engine) == ("incident-quick", "sglang")


def test_a_targets_port_is_its_urls_or_its_schemes() -> None:
    """One helper (ports.url_port) for every reader of a target's port: the scraper, the local discovery, the
    settings reader; a URL without one reaches its scheme's (the local discovery read None there before)."""
    from oomguard.common.ports import url_port
    from oomguard.exporter.config import TargetConfig

    assert TargetConfig(url="http://127.0.0.1").port == 80
    assert TargetConfig(url="https://engine.example").port == 443
    assert TargetConfig(url="http://127.0.0.1:8000").port == 8000
    assert TargetConfig(url="https://engine.example").label == "engine.example:443"
    with pytest.raises(ValueError):
        url_port("http://127.0.0.1:99999")


CLUSTER = "kubernetes:\n  scope: cluster\n  port: http\ndcgm:\n  discover: true\n  namespaces: [gpu-operator]\n"


def test_a_shard_from_the_statefulset_pods_name_or_flags_and_a_wrong_one_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubernetes.shards` > 1: the shard is the ordinal ending $POD_NAME (a StatefulSet's pod), or the flag's; an
    ordinal past the shards, a name without one, or sharding a node agent is refused, naming the fix."""
    from oomguard import cli

    seen = {}
    monkeypatch.setattr(cli, "serve", lambda config, web_config_file=None: seen.setdefault("config", config) and 0)
    path = write(tmp_path, CLUSTER)
    monkeypatch.setenv("POD_NAME", "oomguard-2")
    main(["serve", "--config", str(path), "--kubernetes.shards", "4"])
    k8s = seen.pop("config").kubernetes
    assert (k8s.shard, k8s.shards) == (2, 4)
    monkeypatch.setenv("OOMGUARD_KUBERNETES_SHARDS", "3")
    main(["serve", "--config", str(path), "--kubernetes.shard", "0"])
    k8s = seen.pop("config").kubernetes
    assert (k8s.shard, k8s.shards) == (0, 3)
    for pod, wanted in (("oomguard-3", "makes this shard 3, but shards is 3"), ("oomguard", "ends in no ordinal")):
        monkeypatch.setenv("POD_NAME", pod)
        with pytest.raises(ConfigError, match=wanted):
            load_config(path, {"kubernetes.shards": 3})
    monkeypatch.setenv("NODE_NAME", "gpu-a")
    (tmp_path / "node").mkdir()
    node_agent = write(tmp_path / "node", "kubernetes:\n  port: http\n")
    with pytest.raises(ConfigError, match="only the cluster mode"):
        load_config(node_agent, {"kubernetes.shards": 2})
    monkeypatch.delenv("POD_NAME")
    monkeypatch.delenv("OOMGUARD_KUBERNETES_SHARDS")
    main(["serve", "--config", str(path)])
    assert seen.pop("config").kubernetes.shard == 0  # unsharded: one exporter reads every node
