"""The digital twin of a multi-region GPU fleet (the embedded default world)."""
