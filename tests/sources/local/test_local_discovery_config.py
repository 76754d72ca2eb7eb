"""The `discovery:` block: when local discovery runs, its errors, and what check-config says of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from oomguard.cli import main
from oomguard.exporter.config import ConfigError
from oomguard.exporter.describe import describe
from oomguard.simulate.checks import load_config


def config_of(tmp_path: Path, text: str):
    path = tmp_path / "oomguard.yaml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(
    ("text", "discovers"),
    [
        ("", True),  # nothing names an engine: discover them
        ("targets:\n  - url: http://127.0.0.1:8000\n", False),
        ("kubernetes:\n  port: 8000\n  node_name: n1\n", False),
        ("simulation:\n  scenario: steady\n", False),
        ("discovery:\n  local: off\n", False),  # YAML 1.1 reads a bare off as false
        ("discovery:\n  local: 'off'\n", False),
        ("targets:\n  - url: http://127.0.0.1:8000\ndiscovery:\n  local: on\n", True),
    ],
)
def test_auto_is_on_only_when_nothing_else_names_an_engine(tmp_path: Path, text: str, discovers: bool) -> None:
    assert config_of(tmp_path, text).discovers_local is discovers


def test_defaults_and_errors(tmp_path: Path) -> None:
    discovery = config_of(tmp_path, "").discovery
    assert (discovery.local, discovery.interval_seconds, discovery.forget_after_seconds) == ("auto", 10.0, 600.0)
    with pytest.raises(ConfigError) as caught:
        config_of(tmp_path, "discovery:\n  local: sometimes\n  interval_seconds: 0\n  forget_after: 5\n")
    message = str(caught.value)
    assert "discovery.local: write auto, on or off (got 'sometimes')" in message
    assert "discovery.interval_seconds: must be greater than 0; write a number above 0 in seconds, e.g. 5 (got 0)" in (
        message
    )
    assert "discovery.forget_after: unknown key; did you mean 'forget_after_seconds'?" in message


def test_check_config_says_what_is_discovered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "oomguard.yaml"
    path.write_text("discovery:\n  interval_seconds: 5\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "engines: no targets configured: local engines are discovered by their command lines" in out
    assert "every 5s, forgotten 600s after they go" in out
    both = describe(config_of(tmp_path, "targets:\n  - url: http://127.0.0.1:8000\ndiscovery:\n  local: on\n"))
    assert both[0].startswith("engines: 127.0.0.1:8000 (vllm at http://127.0.0.1:8000")
    assert "; and the engines on this host, discovered by their command lines" in both[0]
