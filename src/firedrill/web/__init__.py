"""The HTTP face of ``firedrill serve``: Alertmanager's webhook, the JSON API and its events.

``create_app(settings)`` builds the FastAPI application; everything it decides is delegated to
``firedrill.app.serve``. See ``docs/serve.md`` for the routes, the tokens file and the limits.
"""

from firedrill.web.app import WebSettings, create_app

__all__ = ["WebSettings", "create_app"]
