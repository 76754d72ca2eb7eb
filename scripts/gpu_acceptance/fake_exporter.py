"""The exporter as `oomguard serve --config FILE` runs it, on the stand-in NVML, whose GPU follows the allocating
child (the run without a GPU).

`python -m scripts.gpu_acceptance.fake_exporter --config FILE --spec SPEC`: the same configuration file, Runtime,
web application and listener as `oomguard serve` (cli.serve); only the NVML library differs. The stand-in's GPU
memory and process list are refreshed from the child's state file at each NVML device count, which the NVML source
calls first in every read: in the NVML thread, never on the event loop.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from oomguard.exporter.config import ConfigError, parse_listen_address
from oomguard.exporter.config_loader import load_config
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app
from oomguard.exporter.web_config.server import run
from oomguard.simulate.fake_nvml import FakeGpu, FakeNvml, FakeProcess

from .reference import FakeSpec, child_holds, read_state

log = logging.getLogger("gpu_acceptance.fake_exporter")


def fake_nvml(spec: FakeSpec) -> FakeNvml:
    gpus = [
        FakeGpu(index, total_bytes=g.total_bytes, used_bytes=g.used_bytes, reserved_bytes=g.reserved_bytes)
        for index, g in enumerate(spec.gpus)
    ]
    child_gpu = gpus[spec.child_gpu]
    base = child_gpu.used_bytes

    def follow_child(call: str) -> None:
        if call != "nvmlDeviceGetCount":
            return
        state = read_state(spec.child_state)
        held = child_holds(state)
        child_gpu.used_bytes = base + held
        # Replaced whole: the NVML thread is the only reader, but a list is never seen half-built either way.
        child_gpu.processes = [FakeProcess(int(state["pid"]), held)] if held else []

    return FakeNvml(gpus, before_call=follow_child)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--spec", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    runtime = Runtime(config, nvml_lib=fake_nvml(FakeSpec.load(args.spec)))
    host, port = parse_listen_address(config.web.listen_address)
    log.info("the exporter on the stand-in NVML (no GPU here), on %s:%d", host, port)
    return run(make_app(runtime, None), host, port, None)


if __name__ == "__main__":
    raise SystemExit(main())
