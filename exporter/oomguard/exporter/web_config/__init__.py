"""`--web.config.file`: TLS, client certificates, basic auth and response headers, in the
Prometheus exporter toolkit's file format (docs/security.md).

`model.py` the file's keys, `tls.py` the SSL context, `auth.py` basic auth, `state.py` the
configuration in force and its reloads, `server.py` the listener.
"""

from __future__ import annotations

from oomguard.exporter.web_config.state import WebConfigState, WebSettings, load_web_config

__all__ = ["WebConfigState", "WebSettings", "load_web_config"]
