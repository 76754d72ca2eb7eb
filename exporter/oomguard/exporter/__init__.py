"""The exporter: its sources, the collection, the joins, the exposition, the runtime that builds them and the web
server (docs/architecture.md)."""
