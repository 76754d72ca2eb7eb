"""Kubernetes pod discovery: the engine pods of this node as targets, and what the API says of them.

- `api.py`: the connection (service account or kubeconfig) and the API's list and watch requests;
- `watch.py`: list, then watch from its resourceVersion; relist on 410 Gone and every resync;
- `pods.py`: a Pod object -> the target it makes (address, engine container, restarts, last termination);
- `probes.py`: the probes -> the time before the first possible kill;
- `cgroup.py`: NVML's pids -> pod UID and container ID, from /proc/<pid>/cgroup;
- `discovery.py`: all of it together, kept in step with the runtime's targets and event sources.

The protocol is spoken with aiohttp, already a dependency (the exporter's server), rather than kubernetes_asyncio:
measured here, importing that client adds 40 MiB of RSS (36 -> 76 MiB) and 0.3 s, and 48 MiB on disk
with three more packages, for an exporter of 55 MiB whose DaemonSet requests 96Mi; two GETs are needed.
"""
