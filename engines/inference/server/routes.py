"""Every route the embedded inference server answers, as data: what `areal-graph serve --help` lists.

Why data in a module of its own: the help must print without loading the server (aiohttp
handlers, the engine, torch), and a test holds this list to the server's own router
(tests/engines/inference/server/test_routes.py), so a route added to the server and not here
fails it, and so does one listed here that the server does not answer.
"""

from __future__ import annotations

# (group, methods, path): the methods as the server registers them ("*": any), paths as aiohttp writes them
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("SGLang's native API (the subset RL uses)", "POST|PUT", "/generate"),
    ("SGLang's native API (the subset RL uses)", "POST", "/update_weights_from_disk"),
    ("SGLang's native API (the subset RL uses)", "POST", "/pause_generation"),
    ("SGLang's native API (the subset RL uses)", "POST", "/continue_generation"),
    ("SGLang's native API (the subset RL uses)", "POST", "/abort_request"),
    ("SGLang's native API (the subset RL uses)", "GET", "/health"),
    ("SGLang's native API (the subset RL uses)", "GET", "/health_generate"),
    ("SGLang's native API (the subset RL uses)", "GET", "/get_model_info"),
    ("SGLang's native API (the subset RL uses)", "GET", "/get_weight_version"),
    ("SGLang's native API (the subset RL uses)", "GET", "/get_server_info"),
    ("SGLang's native API (the subset RL uses)", "*", "/flush_cache"),
    ("ours", "POST", "/update_weights_from_shared_memory"),
    ("ours", "GET", "/get_weights_digest"),
    ("ours", "GET", "/get_spans"),
    ("ours", "GET", "/get_clock"),
    ("OpenAI's", "POST", "/v1/chat/completions"),
    ("OpenAI's", "POST", "/v1/completions"),
    ("OpenAI's", "GET", "/v1/models"),
    ("OpenAI's", "GET", "/v1/models/{model}"),
    ("OpenAI's", "POST", "/v1/responses"),
    ("OpenAI's", "GET|DELETE", "/v1/responses/{id}"),
    ("OpenAI's", "GET", "/v1/responses/{id}/input_items"),
)
# answered by every server but not a route of its own: any other /v1 path gets an error naming what is served
CATCH_ALL = "/v1/{tail}"


def routes_text() -> str:
    """The routes by group, one line each: `METHODS PATH`."""
    lines: list[str] = []
    group = None
    for g, methods, path in ROUTES:
        if g != group:
            lines.append(f"{g}:")
            group = g
        lines.append(f"  {methods.replace('|', ', '):<12s} {path}")
    return "\n".join(lines)
