"""Contained execution of code we do not trust to be quick or safe: a sandbox for model-written code, a process pool for reward functions."""
