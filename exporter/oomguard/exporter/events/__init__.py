"""Events: OOMs, engine deaths, restarts and kernel OOM kills, counted once from wherever they show up."""
