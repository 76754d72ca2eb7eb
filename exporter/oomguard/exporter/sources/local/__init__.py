"""The engines running on this host, found by their command lines (docs/engines.md, "Discovery of local engines").

`cmdline.py` lists the processes and tells which are engines and where they listen; `settings.py` reads an
engine's settings (its command line, environment and installed version); `discovery.py` keeps the runtime's
targets in step with them.
"""
