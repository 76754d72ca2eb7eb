"""The engines' simulators, one module each (`python -m oomguard.simulate.engines.vllm`).

Nothing is imported here: each simulator is a process of its own, whose imports count as its loading time (its
clock starts with the process), so it loads only what it serves. The supervisor that runs them, given what an
engine's plugin knows of its simulator, is simulate/supervisor.py's `simulation()`.
"""
