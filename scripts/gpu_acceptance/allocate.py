"""The allocating child: GPU memory taken step by step until the allocator refuses, the refusal logged as vLLM logs
a CUDA OOM, then everything freed and the process gone.

`python -m scripts.gpu_acceptance.allocate --uuid GPU-... --log FILE --state FILE [--fake-spec SPEC]`

On a GPU it allocates through the CUDA driver API (`libcuda.so.1` via ctypes: cuInit, the device whose UUID is
given, its primary context, cuMemAlloc_v2 in steps) until cuMemAlloc_v2 answers CUDA_ERROR_OUT_OF_MEMORY (2). With
`--fake-spec` it takes the same steps against the stand-in GPU (reference.py), which the stand-in NVML follows.
Its progress goes to the state file (replaced whole at each step); the OOM goes to the log file, the engine's log
that the exporter follows, as vLLM's engine core writes it: its fatal-error record, then the traceback whose last
line is PyTorch's `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...`.

Exit status: 0 the OOM reached, logged and everything freed; 3 no OOM within the steps allowed; 4 a CUDA error
other than out of memory (named on stderr).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from .reference import GIB, MIB, FakeSpec, write_state

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
FAKE_CONTEXT_BYTES = 512 * MIB  # what a CUDA context holds on an H100, about: the stand-in's child holds as much


class CudaError(RuntimeError):
    pass


class CudaDriver:
    """The few driver API calls the run needs. The device is picked by UUID: CUDA's own numbering follows
    CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES, NVML's does not."""

    def __init__(self, uuid: str) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.lib.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        self._check("cuInit", self.lib.cuInit(0))
        count = ctypes.c_int()
        self._check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(count)))
        self.device = ctypes.c_int(-1)
        seen = []
        for ordinal in range(count.value):
            device = ctypes.c_int()
            self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(device), ordinal))
            found = self._uuid(device)
            seen.append(found)
            if found.lower() == uuid.lower():
                self.device = device
                break
        if self.device.value < 0:
            raise CudaError(f"no CUDA device has UUID {uuid} (CUDA sees {seen}; CUDA_VISIBLE_DEVICES hides it?)")
        self.context = ctypes.c_void_p()
        self._check(
            "cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device)
        )
        self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(self.context))
        self.pointers: list[int] = []

    def _name(self, result: int) -> str:
        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(result, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return name.value.decode()
        return f"CUresult {result}"

    def _check(self, call: str, result: int) -> None:
        if result != CUDA_SUCCESS:
            raise CudaError(f"{call}: {self._name(result)} ({result})")

    def _uuid(self, device: ctypes.c_int) -> str:
        raw = (ctypes.c_ubyte * 16)()
        self._check("cuDeviceGetUuid", self.lib.cuDeviceGetUuid(raw, device))
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check("cuMemGetInfo_v2", self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def context_bytes(self) -> int:
        return 0  # the context's memory shows in NVML; the driver API does not say how much of it is the context

    def alloc(self, size: int) -> bool:
        """False when the allocator refuses for lack of memory; any other error raises."""
        pointer = ctypes.c_uint64()
        result = self.lib.cuMemAlloc_v2(ctypes.byref(pointer), size)
        if result == CUDA_ERROR_OUT_OF_MEMORY:
            return False
        self._check("cuMemAlloc_v2", result)
        self.pointers.append(pointer.value)
        return True

    def close(self) -> None:
        while self.pointers:
            self.lib.cuMemFree_v2(self.pointers.pop())
        release = getattr(self.lib, "cuDevicePrimaryCtxRelease_v2", None) or self.lib.cuDevicePrimaryCtxRelease
        release(self.device)


class FakeDriver:
    """The same steps against the stand-in GPU: refused once they would pass its free memory."""

    def __init__(self, spec: FakeSpec) -> None:
        gpu = spec.gpus[spec.child_gpu]
        self.total = gpu.total_bytes
        self.capacity = gpu.total_bytes - gpu.reserved_bytes - gpu.used_bytes - FAKE_CONTEXT_BYTES
        self.held = 0

    def mem_info(self) -> tuple[int, int]:
        return self.capacity - self.held, self.total

    def context_bytes(self) -> int:
        return FAKE_CONTEXT_BYTES

    def alloc(self, size: int) -> bool:
        if self.held + size > self.capacity:
            return False
        self.held += size
        return True

    def close(self) -> None:
        self.held = 0


def vllm_stamp() -> str:
    """vLLM's logger's time, "12-02 12:00:00", before the source in its record header."""
    return time.strftime("%m-%d %H:%M:%S")


def oom_record(*, pid: int, gpu: int, step: int, free: int, total: int, held: int) -> str:
    """What vLLM's engine core writes when a forward pass runs out of GPU memory (vLLM V1, PyTorch 2.x wording):
    its fatal-error record, then the traceback, one record header per line, ending in PyTorch's exception."""
    tag = f"(EngineCore pid={pid})"
    return (
        f"{tag} ERROR {vllm_stamp()} [core.py:701] EngineCore encountered a fatal error.\n"
        f"{tag} Traceback (most recent call last):\n"
        f'{tag}   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 692, in run_engine_core\n'
        f"{tag}     engine_core.run_busy_loop()\n"
        f'{tag}   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1589, '
        f"in execute_model\n"
        f"{tag}     hidden_states = self.model(\n"
        f"{tag} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {step / GIB:.2f} GiB. GPU {gpu} has a "
        f"total capacity of {total / GIB:.2f} GiB of which {free / MIB:.2f} MiB is free. Including non-PyTorch "
        f"memory, this process has {held / GIB:.2f} GiB memory in use. Of the allocated memory {held / GIB:.2f} GiB "
        f"is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated "
        f"memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        f"See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-"
        f"variables)\n"
    )


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally that frees the memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uuid", required=True, help="the GPU to allocate on, by NVML's UUID")
    parser.add_argument("--gpu-index", type=int, default=0, help="its NVML index, for the log line")
    parser.add_argument("--log", type=Path, required=True, help="the engine log the exporter follows")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--fake-spec", type=Path, help="allocate on the stand-in GPU instead (no GPU here)")
    parser.add_argument("--step-mib", type=int, default=1024)
    parser.add_argument("--climb-seconds", type=float, default=80.0, help="about how long the climb takes")
    parser.add_argument("--hold-seconds", type=float, default=2.0, help="memory kept this long after the OOM")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    pid = os.getpid()
    state: dict[str, Any] = {"pid": pid, "phase": "starting", "allocated_bytes": 0, "context_bytes": 0, "steps": 0}
    write_state(args.state, state)
    driver: CudaDriver | FakeDriver | None = None
    try:
        driver = FakeDriver(FakeSpec.load(args.fake_spec)) if args.fake_spec else CudaDriver(args.uuid)
        free, total = driver.mem_info()
        step = args.step_mib * MIB
        steps = max(1, free // step)
        # A pace that fills the GPU in about --climb-seconds, whatever its size; bounded so that a small GPU is
        # not filled in a blink, nor a huge one too slowly for the run's 8 minutes.
        interval = min(2.0, max(0.1, args.climb_seconds / steps))
        state.update(
            phase="allocating",
            context_bytes=driver.context_bytes(),
            total_bytes=total,
            free_at_start_bytes=free,
            step_bytes=step,
            interval_seconds=interval,
            started_at=time.time(),
        )
        write_state(args.state, state)
        with args.log.open("a", encoding="utf-8") as log:
            log.write(
                f"(EngineCore pid={pid}) INFO {vllm_stamp()} [gpu_worker.py:239] Available memory {free / GIB:.2f} "
                f"GiB of {total / GIB:.2f} GiB; allocating {step / GIB:.2f} GiB every {interval:.2f} s\n"
            )
            log.flush()
            limit = math.ceil(steps * 1.5) + 16  # CUDA does not oversubscribe cuMemAlloc: far past the end
            for _ in range(limit):
                if not driver.alloc(step):
                    free, total = driver.mem_info()
                    held = int(state["allocated_bytes"]) + driver.context_bytes()
                    state.update(phase="oom", oom_at=time.time(), free_at_oom_bytes=free, peak_bytes=held)
                    write_state(args.state, state)
                    log.write(oom_record(pid=pid, gpu=args.gpu_index, step=step, free=free, total=total, held=held))
                    log.flush()
                    time.sleep(args.hold_seconds)
                    return 0
                state.update(allocated_bytes=int(state["allocated_bytes"]) + step, steps=int(state["steps"]) + 1)
                write_state(args.state, state)
                time.sleep(interval)
        state.update(phase="no_oom")
        print(f"no CUDA_ERROR_OUT_OF_MEMORY after {limit} steps of {args.step_mib} MiB", file=sys.stderr)
        return 3
    except (CudaError, OSError) as exc:
        state.update(phase="error", error=str(exc))
        print(f"allocate: {exc}", file=sys.stderr)
        return 4
    finally:
        if driver is not None:
            driver.close()
        if state["phase"] in ("allocating", "oom"):
            state["phase"] = "freed"
        state["allocated_bytes"] = 0
        state["ended_at"] = time.time()
        write_state(args.state, state)


if __name__ == "__main__":
    raise SystemExit(main())
