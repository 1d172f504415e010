"""``/docs``: Swagger UI 5 (it reads OpenAPI 3.1, the version FastAPI writes), vendored in
this package under ``static/swagger-ui`` and served from here: no CDN, clusters are often
offline. ``/openapi.json`` is FastAPI's own; there is no ``/redoc`` (ReDoc would load its
script from a CDN).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "static" / "swagger-ui"
PREFIX = "/static/swagger-ui"


def mount(app: FastAPI) -> None:
    """Serve the vendored Swagger UI files and ``GET /docs`` on ``app``."""
    if not (STATIC / "swagger-ui-bundle.js").is_file():
        raise RuntimeError(f"Swagger UI is missing from the fleetcare-api package ({STATIC}): "
                           "reinstall it (`pip install --force-reinstall fleetcare-api`)")
    app.mount(PREFIX, StaticFiles(directory=STATIC), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{PREFIX}/favicon-32x32.png")
