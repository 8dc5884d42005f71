"""firedrill: incident response and DR game days for GPU inference and training fleets."""

__version__ = "0.1.0"
