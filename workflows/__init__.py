"""Shipped workflow YAMLs (the graphs users run) and, in `rollout/`, the Python rollout classes they name."""
