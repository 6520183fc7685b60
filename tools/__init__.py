"""Tools that agents and rewards call: a sandbox for model-written code."""
