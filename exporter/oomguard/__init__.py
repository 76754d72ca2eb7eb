"""oomguard: a Prometheus exporter that sees GPU memory exhaustion coming."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("oomguard")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+unknown"
