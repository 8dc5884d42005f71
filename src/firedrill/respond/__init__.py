"""Incident command: incidents, severity, what changed, levers, comms, break-glass, postmortems."""
