"""Adapters: the edge where firedrill meets I/O: HTTP servers, Kubernetes, Prometheus, files."""
