"""The real-GPU acceptance run (docs/testing.md, "The GPU acceptance run").

`scripts/gpu-acceptance.sh` runs it: the exporter against `nvidia-smi`, a child that allocates GPU memory through
the CUDA driver API until CUDA refuses and logs the OOM as vLLM does, NVML's cost per scrape, and MIG as found.
Without a GPU it runs the same checks on a stand-in NVML that follows a stand-in allocator, its figures labelled
simulated. Nothing here changes a GPU's mode or settings, or needs the network.
"""
