"""Each engine's knobs (engines/<name>/: its concurrency cap, its reservation, its tensor-parallel flag) are what the
diagnosis names and the simulation tells the engine: each flag must be one the engine's own command-line reader
takes, for the setting the knob names."""

from __future__ import annotations

import pytest

from oomguard.diagnose import capacity
from oomguard.exporter.engines import ENGINES
from oomguard.exporter.engines.base import Knobs

# A command line each engine's reader recognises as its own, before the knobs' flags are added.
PROGRAMS = {
    "vllm": ["vllm", "serve", "some/model"],
    "sglang": ["python3", "-m", "sglang.launch_server", "--model-path", "some/model"],
    "tgi": ["text-generation-launcher", "--model-id", "some/model"],
}
WITH_KNOBS = [name for name, plugin in ENGINES.items() if plugin.knobs != Knobs()]


def test_the_engines_with_knobs_are_those_the_diagnosis_names() -> None:
    assert sorted(WITH_KNOBS) == sorted(PROGRAMS) == sorted(capacity.ENGINE_KNOBS)
    assert capacity.ENGINE_KNOBS["vllm"] == ("max_num_seqs", "gpu_memory_utilization")
    assert capacity.FLAGS["mem_fraction_static"] == "--mem-fraction-static"


@pytest.mark.parametrize("name", WITH_KNOBS)
def test_each_knobs_flag_sets_its_setting_on_the_engines_command_line(name: str) -> None:
    plugin = ENGINES[name]
    knobs = plugin.knobs
    assert plugin.matches is not None and plugin.settings is not None
    argv = list(PROGRAMS[name])
    assert plugin.matches(tuple(argv)), f"{name}: the test's command line is not the engine's"
    told = {knob.setting: (knob.flag, value) for knob, value in ((knobs.concurrency, 7.0), (knobs.reservation, 0.5))
            if knob is not None}  # fmt: skip
    for flag, value in told.values():
        argv += [flag, f"{value:g}"]
    if knobs.tensor_parallel_flag is not None:
        argv += [knobs.tensor_parallel_flag, "3"]
    settings = plugin.settings(tuple(argv), None, {})
    for setting, (flag, value) in told.items():
        assert settings[setting].value == value, (name, flag, settings)
        assert settings[setting].origin == "flag", (name, flag)
    if knobs.tensor_parallel_flag is not None:
        assert any(s.value == 3.0 and s.origin == "flag" for s in settings.values()), (name, settings)
