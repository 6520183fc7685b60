"""The arithmetic environment served by OpenEnv's own FastAPI app, as an OpenEnv environment's
`server/app.py` is: run it anywhere and point a workflow's `rollout_args.url` at it.

    uvicorn areal_graph.workflows.openenv_envs.arith_server:app --port 8011
"""

from __future__ import annotations

from openenv.core.env_server import create_fastapi_app

from areal_graph.workflows.openenv_envs.arith import ArithAction, ArithEnvironment, ArithObservation

MAX_SESSIONS = 512  # episodes at once (one WebSocket session each): a run's concurrent rollouts x group size

app = create_fastapi_app(ArithEnvironment, ArithAction, ArithObservation, max_concurrent_envs=MAX_SESSIONS)
