"""Environments written to OpenEnv's interface (openenv-core: an `Environment` with reset/step/state,
pydantic Action/Observation/State, served by `create_fastapi_app`), shipped with the workflows that
train on them; the rollout class is workflows/rollout/openenv_episode.py. docs/agents.md,
"OpenEnv environments"."""
