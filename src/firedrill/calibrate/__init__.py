"""Fit a fleet spec to a real fleet's series: rehearse on your fleet, not on the demo one.

A drill's verdict is only as true as the twin's parameters. This package turns series read from
a Prometheus (by an adapter; nothing here does I/O) into the parameters the twin models: replica
counts, demand per product and region with its diurnal shape, the prefill and decode latency
curves, KV bytes per token, GPU fault rates by XID class and what hydrate exported. Every
parameter comes with its fit quality, and every parameter it could not fit keeps the base
spec's value and says so.
"""
