"""A simulated dcgm-exporter beside the simulated engine: the simulation in the cluster mode's GPU source.

It serves the simulation's GPUs (the fake NVML's, on the scenario's clock) as dcgm-exporter writes them with its
Kubernetes mapping on, in one of two versions (`simulation.dcgm_version`):
- "3.x": DCGM_FI_DEV_FB_USED, _FREE and _RESERVED in MiB, GPU_UTIL in percent, labelled with the GPU, its UUID, PCI
  bus, model and `Hostname`, and the pod using it (empty pod labels on a GPU in no pod);
- "4.10" (the naming of 4.9 and later): DCGM_FI_DEV_FB_USED_BYTES, _FREE_BYTES, _RESERVED_BYTES and
  DCGM_FI_DEV_FB_CAPACITY_BYTES in bytes, GPU_UTIL_RATIO, `hostname`, the driver label
  DCGM_FI_SYSTEM_DRIVER_VERSION, pod labels only on a GPU in a pod, families by name and samples by UUID, values as
  Go's shortest %g, as the renderer of tests/fixtures/dcgm/README.md (body h) writes them.
What dcgm-exporter does not publish (who holds the memory, process by process) it does not either, so the exporter
reads the GPUs as the cluster mode does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Literal

from aiohttp import web

from oomguard.simulate.fake_nvml import FakeGpu

MIB = 1024**2
_FAMILIES = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB)."),
)


_FAMILIES_4_10 = (  # sorted by name, as the expfmt renderer writes them
    ("DCGM_FI_DEV_FB_CAPACITY_BYTES", "Total framebuffer memory (in bytes)."),
    ("DCGM_FI_DEV_FB_FREE_BYTES", "Framebuffer memory free (in bytes)."),
    ("DCGM_FI_DEV_FB_RESERVED_BYTES", "Framebuffer memory reserved (in bytes)."),
    ("DCGM_FI_DEV_FB_USED_BYTES", "Framebuffer memory used (in bytes)."),
    ("DCGM_FI_DEV_GPU_UTIL_RATIO", "GPU utilization (ratio, 0 to 1)."),
)
DcgmVersion = Literal["3.x", "4.10"]
SIMULATED_DRIVER_LABEL = "550.54.15"  # the fake NVML's driver (simulate/supervisor.py)


def go_float(value: float) -> str:
    """A finite value as Go's strconv.FormatFloat(v, 'g', -1, 64), which expfmt writes: the shortest digits that read
    back exactly, in exponent form from 1e6 (or below 1e-4)."""
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    power = len(text) + int(exponent) - 1
    if -4 <= power < 6:
        return repr(value).removesuffix(".0")
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'+' if power >= 0 else '-'}{abs(power):02d}"


def body(
    gpus: Sequence[FakeGpu],
    *,
    node: str,
    pod: tuple[str, str, str],
    pod_gpus: tuple[int, ...],
    version: DcgmVersion = "3.x",
) -> str:
    """The GPUs as dcgm-exporter writes them; `pod` (namespace, name, container) is on `pod_gpus`' series."""
    if version == "4.10":
        return _body_4_10(gpus, node=node, pod=pod, pod_gpus=pod_gpus)
    lines = []
    for family, help_text in _FAMILIES:
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} gauge"]
        for gpu in gpus:
            if gpu.lost:
                continue  # dcgm-exporter stops writing a GPU it cannot read
            free = max(gpu.total_bytes - gpu.reserved_bytes - gpu.used_bytes, 0)
            value = {
                "DCGM_FI_DEV_GPU_UTIL": gpu.utilization_percent,
                "DCGM_FI_DEV_FB_FREE": free // MIB,
                "DCGM_FI_DEV_FB_USED": gpu.used_bytes // MIB,
                "DCGM_FI_DEV_FB_RESERVED": gpu.reserved_bytes // MIB,
            }[family]
            namespace, name, container = pod if gpu.index in pod_gpus else ("", "", "")
            labels = (
                f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",device="nvidia{gpu.index}",'
                f'modelName="{gpu.name}",Hostname="{node}",container="{container}",namespace="{namespace}",'
                f'pod="{name}"'
            )
            lines.append(f"{family}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def _body_4_10(gpus: Sequence[FakeGpu], *, node: str, pod: tuple[str, str, str], pod_gpus: tuple[int, ...]) -> str:
    lines = []
    readable = sorted((gpu for gpu in gpus if not gpu.lost), key=lambda gpu: gpu.uuid)  # the label signature's order
    for family, help_text in _FAMILIES_4_10:
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} gauge"]
        for gpu in readable:
            free = max(gpu.total_bytes - gpu.reserved_bytes - gpu.used_bytes, 0)
            value = {
                "DCGM_FI_DEV_FB_CAPACITY_BYTES": gpu.total_bytes,
                "DCGM_FI_DEV_FB_FREE_BYTES": free,
                "DCGM_FI_DEV_FB_RESERVED_BYTES": gpu.reserved_bytes,
                "DCGM_FI_DEV_FB_USED_BYTES": gpu.used_bytes,
                "DCGM_FI_DEV_GPU_UTIL_RATIO": gpu.utilization_percent / 100,
            }[family]
            labels = (
                f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",device="nvidia{gpu.index}",'
                f'modelName="{gpu.name}",hostname="{node}",DCGM_FI_SYSTEM_DRIVER_VERSION="{SIMULATED_DRIVER_LABEL}"'
            )
            if gpu.index in pod_gpus:
                namespace, name, container = pod
                labels += f',container="{container}",namespace="{namespace}",pod="{name}"'
            lines.append(f"{family}{{{labels}}} {go_float(float(value))}")
    return "\n".join(lines) + "\n"


class SimulatedDcgmExporter:
    """Its /metrics on 127.0.0.1 at a free port, for the life of the simulation."""

    def __init__(
        self,
        gpus: Callable[[], Sequence[FakeGpu]],
        *,
        node: str,
        pod: tuple[str, str, str],
        pod_gpus: tuple[int, ...],
        version: DcgmVersion = "3.x",
    ) -> None:
        """`gpus`: the simulation's GPUs as they are now (Simulation.current_gpus)."""
        self.gpus, self.node, self.pod, self.pod_gpus = gpus, node, pod, pod_gpus
        self.version: DcgmVersion = version
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/metrics"

    async def _metrics(self, request: web.Request) -> web.Response:
        text = body(self.gpus(), node=self.node, pod=self.pod, pod_gpus=self.pod_gpus, version=self.version)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
