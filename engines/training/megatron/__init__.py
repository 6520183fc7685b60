"""Megatron-Core as a training backend (`models.<name>.backend: megatron`): layout.py maps weights, engine.py trains."""
