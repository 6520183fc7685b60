"""Shipped workflow YAMLs and the example Python rollout workflows they name."""
