"""Reward functions for end-to-end tests (imported by the reward worker via PYTHONPATH).

A random tiny model never solves arithmetic, so a math reward would be 0 everywhere and the
advantages (and updates) 0; this one varies with the sampled text, so the update is non-zero.
"""


def length_parity(completion: str, answer: str) -> float:
    return float(len(completion) % 2 == 0)
