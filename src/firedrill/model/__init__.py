"""Typed domain objects shared by every layer: specs, operations, change events, series."""
