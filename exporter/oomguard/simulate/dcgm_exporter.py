"""A simulated dcgm-exporter beside the simulated engine: the simulation in the cluster mode's GPU source.

It serves the simulation's GPUs (the fake NVML's, on the scenario's clock) as dcgm-exporter 3.x writes them with
its Kubernetes mapping on: DCGM_FI_DEV_FB_USED, _FREE and _RESERVED in MiB, GPU_UTIL in percent, labelled with the
GPU, its UUID, PCI bus, model and node, and the pod using it. What dcgm-exporter does not publish (who holds the
memory, process by process) it does not either, so the exporter reads the GPUs as the cluster mode does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web

from oomguard.simulate.fake_nvml import FakeGpu

MIB = 1024**2
_FAMILIES = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB)."),
)


def body(gpus: Sequence[FakeGpu], *, node: str, pod: tuple[str, str, str], pod_gpus: tuple[int, ...]) -> str:
    """The GPUs as dcgm-exporter writes them; `pod` (namespace, name, container) is on `pod_gpus`' series."""
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


class SimulatedDcgmExporter:
    """Its /metrics on 127.0.0.1 at a free port, for the life of the simulation."""

    def __init__(
        self,
        gpus: Callable[[], Sequence[FakeGpu]],
        *,
        node: str,
        pod: tuple[str, str, str],
        pod_gpus: tuple[int, ...],
    ) -> None:
        """`gpus`: the simulation's GPUs as they are now (Simulation.current_gpus)."""
        self.gpus, self.node, self.pod, self.pod_gpus = gpus, node, pod, pod_gpus
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
        text = body(self.gpus(), node=self.node, pod=self.pod, pod_gpus=self.pod_gpus)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
