"""Use cases as functions and services: the CLI and the web layer call these, nothing else."""
