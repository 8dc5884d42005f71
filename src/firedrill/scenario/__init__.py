"""Scenarios: a fleet, a timeline of faults and changes, and the outcomes they must produce."""
