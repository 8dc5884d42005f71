"""Use cases: what one command does, from validated specs to a result, with no terminal in sight.

Each use case is a function with keyword-only arguments (``run_gameday``, ``respond``); it
composes the core (drill, scenario, respond) with the adapters it needs (the store, the remote
twin, journal files) and returns a typed outcome or raises a ``FiredrillError``. What a person
should hear while it runs goes through a listener the caller passes in, so the same use case
serves the CLI today and an HTTP API later. The CLI (``firedrill.cli``) parses, calls one use
case, renders what comes back and maps errors to exit codes.
"""
