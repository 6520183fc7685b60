"""Reward functions for end-to-end tests (imported by the reward worker via PYTHONPATH).

A random tiny model never solves arithmetic, so a math reward would be 0 everywhere and the
advantages (and updates) 0; this one varies with the sampled text, so the update is non-zero.
"""


def length_parity(completion: str, answer: str) -> float:
    return float(len(completion) % 2 == 0)


def tool_use_bonus(completion: str, answer: str, episode) -> float:
    """Reads the episode (api/episode.py): 1 for an answer reached after at least one tool call."""
    return float(episode.tool_calls > 0 and episode.assistant_turns >= 2)


def episode_fingerprint(completion: str, answer: str, episode) -> float:
    """Encodes what the reward saw as a number the tests can check."""
    roles = "".join(t.role[0] for t in episode.turns)  # e.g. "paea": prompt, assistant, environment, assistant
    return (
        100 * episode.tool_calls
        + 10 * episode.assistant_turns
        + len(roles)
        + 1000 * int(episode.info.get("marker", 0))
        + 0.5 * episode.truncated
    )


def always_fails(completion: str, answer: str) -> float:
    """A reward with a bug: every call raises (the run must stop, naming it)."""
    raise RuntimeError("the grader's database is down")


def fails_on_odd_length(completion: str, answer: str) -> float:
    """A reward that fails now and then: the failures score 0 and are counted; the rest count."""
    if len(completion) % 2:
        raise ValueError("odd")
    return 1.0
