"""The ``firedrill`` command line: parse, build settings, call a use case, render the result.

A command never orchestrates: it parses its options, calls one use case (``firedrill.app``, or a
store or drill function for the small ones), prints what comes back, and exits with an
``ExitCode`` (``firedrill.cli.common``): 0 ok; 1 failed or expectations not met; 2 usage error
(Click's convention); 3 aborted by a stop condition; 4 a spec or other input error (a clear
message, nothing run); 5 a drill refused to start; 130 cancelled with Ctrl-C.

Layout: ``main`` holds the root app, its own commands (``twin``, ``rules``, ``alerting``,
``respond``, ``schema``, ``export nhc``, ``audit verify``) and ``main()``, the console script
(``firedrill = "firedrill.cli:main"``); each other module is one family of commands.

Adding commands (a new module, say ``serve.py``):

1. Write ``firedrill/cli/serve.py`` with the commands and one function::

       def register(app: typer.Typer) -> None:
           app.command("serve")(serve)                           # firedrill serve
           group(app, "export", "Manifests for the real tools.").command("x")(export_x)

   ``group(app, name)`` (from ``firedrill.cli.common``) returns the sub-app ``firedrill NAME``,
   creating it on first use, so a module never imports another module's sub-app.
2. Import the module in ``main`` and append it to ``COMMAND_MODULES`` (one line each).
3. Use ``ExitCode`` and ``DEFAULT_DB_URL`` from ``common``; never a bare number or a store URL.

A module written for the old flat layout (``firedrill/cli_serve.py`` with ``register(app)``)
drops in by ``git mv`` to ``firedrill/cli/serve.py`` plus step 2.
"""

from __future__ import annotations

from firedrill.cli.main import app, main

__all__ = ["app", "main"]
