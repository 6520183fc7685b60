"""Rollout classes: how one prompt becomes a group of trajectories (single-turn, multi-turn, agents)."""
