"""The API package's structure: ``server`` serves an app it is given and imports nothing
of the API (no cycle with ``app``); every router is part of the app."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import fleetcare.api.routers as routers
from fleetcare.api import server


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_server_imports_nothing_of_the_api() -> None:
    assert not {m for m in _imports(Path(server.__file__)) if m.startswith("fleetcare.api")}


def test_every_router_is_included(store, serve_app) -> None:
    """Each router's routes answer on the app: those in the spec are in /openapi.json, the
    others (pages, sign-in) answer something other than the app's own 404."""
    client = serve_app(store)
    spec = client.get("/openapi.json").json()["paths"]
    for info in pkgutil.iter_modules(routers.__path__):
        module = importlib.import_module(f"fleetcare.api.routers.{info.name}")
        router = getattr(module, "router", None)
        if router is None:
            continue
        for route in router.routes:
            if route.include_in_schema:
                assert route.path in spec, (info.name, route.path)
            else:
                method = sorted(route.methods)[0]
                r = client.request(method, route.path.replace("{node}", "n1"))
                assert r.text != '{"detail":"Not Found"}', (info.name, route.path)
