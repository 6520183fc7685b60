"""The routes `areal-graph serve --help` lists (engines/inference/server/routes.py) are exactly the
routes the embedded server's router answers, and the help shows every one of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from areal_graph.engines.inference.server.http_server import InferenceHTTPServer
from areal_graph.engines.inference.server.routes import CATCH_ALL, ROUTES, routes_text
from support.cli import parser_of


def served_routes() -> set[tuple[str, str]]:
    """(method, path) of every route of a server built around a stand-in engine (HEAD, which
    aiohttp adds to every GET, left out)."""
    server = InferenceHTTPServer(SimpleNamespace(version=0), model_path="m")
    return {
        (r.method, r.resource.canonical)
        for r in server.app.router.routes()
        if r.method != "HEAD" and r.resource.canonical != CATCH_ALL
    }


def test_the_list_is_the_servers_router():
    listed = {(m, path) for _, methods, path in ROUTES for m in methods.split("|")}
    assert listed == served_routes()
    assert ("POST", "/v1/responses") in listed and ("GET", "/get_weights_digest") in listed


def test_serve_help_names_every_route(capsys):
    from areal_graph.cli import cmd_serve

    with pytest.raises(SystemExit):
        parser_of(cmd_serve, "serve")("--help")
    help_text = capsys.readouterr().out
    assert routes_text() in help_text
    shown = {line.split()[-1] for line in help_text.splitlines() if line.strip().startswith(("GET", "POST", "*"))}
    assert shown == {path for _, _, path in ROUTES} and "/v1/responses" in shown
