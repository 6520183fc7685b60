"""DraftStore: suffix-match proposals from the prompt, the request itself, its group and kept answers.

Hand-made cases pin down each rule (longest n, majority vote, continuation length, source
priority, labels); a naive O(n^2) search over plain lists is the reference for random small-vocab
groups; the bounds are checked on counts from stats().
"""

from __future__ import annotations

import random

import pytest

from areal_graph.engines.inference.speculation.drafts import SOURCES, Draft, DraftStore

PRIORITY = {"group": 3, "history": 2, "self": 1, "prompt": 0}


def test_prompt_lookup_proposes_the_prompts_continuation():
    store = DraftStore()
    store.start("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    draft = store.propose("a", [20, 3, 4, 5], k=3)
    assert draft == Draft((6, 7, 8), "prompt", 3)


def test_group_then_history():
    prompt = [50, 51, 52]
    store = DraftStore()
    store.start("first", prompt)
    store.extend("first", [10, 11, 12, 13, 14])
    store.start("second", prompt)
    assert store.propose("second", [10, 11], k=3) == Draft((12, 13, 14), "group", 4)
    store.finish("first")
    store.start("third", prompt)
    # "second" has nothing after 10 11 yet, so only the finished "first" can answer
    assert store.propose("third", [10, 11], k=2) == Draft((12, 13), "history", 4)
    # for "second", "first" was in flight when it started: still "group"
    assert store.propose("second", [10, 11, 12], k=1).source == "group"


def test_empty_answer_gets_how_the_group_began():
    prompt = [7, 8, 9]
    store = DraftStore()
    for rid, answer in (("x", [1, 2, 3]), ("y", [1, 2, 4]), ("z", [5, 6])):
        store.start(rid, prompt)
        store.extend(rid, answer)
    store.start("new", prompt)
    # key (7, 8, 9): its occurrences are the answers' first tokens; 1 has two votes, then the
    # longest continuation (3 tokens in both), then the newest of the two ("y")
    assert store.propose("new", [], k=3) == Draft((1, 2, 4), "group", 3)


def test_self_repetition():
    store = DraftStore()
    store.start("a", [90, 91])
    assert store.propose("a", [1, 2, 3, 1, 2], k=3) == Draft((3, 1, 2), "self", 2)


def test_k_bounds_and_no_match_and_own_suffix_never_proposed():
    store = DraftStore()
    store.start("a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert store.propose("a", [2, 3], k=1) == Draft((4,), "prompt", 2)
    assert len(store.propose("a", [2, 3], k=100).tokens) == 5  # truncated at the prompt's end
    assert store.propose("a", [2, 3], k=0) is None
    store.start("b", [100, 101, 102])
    for answer in ([103], [103, 104], [103, 104, 105, 106]):
        # every n-gram of b's context occurs only as its own current suffix: nothing follows it
        assert store.propose("b", answer, k=4) is None
    store.start("c", [])
    assert store.propose("c", [], k=4) is None
    assert store.propose("c", [1], k=4) is None  # 1-gram below min_match


def test_longest_n_wins_over_shorter_n():
    store = DraftStore(min_match=2, max_match=3)
    # (1, 2) -> 7 three times in the prompt, but (5, 1, 2) -> 8 once
    store.start("a", [1, 2, 7, 1, 2, 7, 1, 2, 7, 5, 1, 2, 8, 0])
    assert store.propose("a", [5, 1, 2], k=2) == Draft((8, 0), "prompt", 3)
    assert store.propose("a", [9, 9, 1, 2], k=1) == Draft((7,), "prompt", 2)


def test_majority_vote_beats_priority_and_length():
    prompt = [1, 2, 3, 0, 1, 2, 3]  # (1, 2) -> 3 twice in the prompt
    store = DraftStore(min_match=2, max_match=2)
    store.start("g", prompt)
    store.extend("g", [1, 2, 4, 4, 4, 4])  # (1, 2) -> 4 once, from the group, longer
    store.start("r", prompt)
    assert store.propose("r", [9, 1, 2], k=4) == Draft((3, 0, 1, 2), "prompt", 2)


def test_tie_breaks_longest_continuation_then_source_priority():
    prompt = [40, 41]
    store = DraftStore(min_match=2, max_match=2)
    store.start("old", prompt)
    store.extend("old", [1, 2, 3, 9, 9, 9])
    store.finish("old")
    store.start("g", prompt)
    store.extend("g", [1, 2, 3, 8])
    store.start("r", prompt)
    # both vote 3; "old" has the longer continuation
    assert store.propose("r", [5, 1, 2], k=4) == Draft((3, 9, 9, 9), "history", 2)
    # up to k=2 both are as long: the group beats history
    assert store.propose("r", [5, 1, 2], k=2) == Draft((3, 8), "group", 2)


def test_restart_reindexes_from_scratch():
    store = DraftStore()
    store.start("a", [100])
    store.extend("a", [1, 2, 3, 1, 2])
    store.extend("a", [4, 5])  # shorter: a restarted answer
    assert store.propose("a", [4, 5, 6, 1, 2], k=2) is None  # the old "1 2 3" is gone
    store.extend("a", [4, 5, 6, 1, 2, 6, 6])
    store.extend("a", [4, 5, 6, 1, 2, 6, 7])  # same length, different last token: also restarted
    assert store.propose("a", [4, 5, 6, 1, 2, 6, 7, 1, 2], k=1) == Draft((6,), "self", 2)


def test_arguments_and_lifecycle_errors():
    for kwargs, name in (
        ({"max_prompts": 0}, "max_prompts"),
        ({"max_answers": -1}, "max_answers"),
        ({"min_match": 0}, "min_match"),
        ({"min_match": 3, "max_match": 2}, "max_match"),
        ({"max_occurrences": 0}, "max_occurrences"),
    ):
        with pytest.raises(ValueError, match=name):
            DraftStore(**kwargs)
    store = DraftStore()
    store.start("a", [1, 2])
    with pytest.raises(ValueError, match="live already"):
        store.start("a", [1, 2])
    store.finish("unknown")  # no-op
    store.finish("a", keep=False)
    assert store.stats() == {"prompts": 1, "answers": 0, "live": 0, "ngrams": 0, "occurrences": 0}
    store.start("a", [1, 2])  # the rid is free again
    assert set(SOURCES) == set(PRIORITY)


def test_lru_over_prompts_and_live_groups_never_evicted():
    store = DraftStore(max_prompts=2)
    for i, prompt in enumerate(([1, 2, 3], [4, 5, 6], [7, 8, 9])):
        store.start(f"r{i}", prompt)
        store.extend(f"r{i}", [i, i + 1, i + 2])
        store.finish(f"r{i}")
    assert store.stats()["prompts"] == 2
    store.start("c", [7, 8, 9])  # the newest group and its kept answer are there
    assert store.propose("c", [2, 3], k=1) == Draft((4,), "history", 4)
    store.start("again", [1, 2, 3])  # the first group was evicted with its answer
    assert store.propose("again", [0, 1], k=1) is None
    assert store.stats()["prompts"] == 2  # [4, 5, 6] went to make room: least recently used
    store.finish("again")
    store.finish("c")
    store = DraftStore(max_prompts=1)
    for i in range(3):
        store.start(f"live{i}", [i, i, i])
    assert store.stats()["prompts"] == 3  # all in flight: over the bound until they finish
    store.finish("live0")
    assert store.stats()["prompts"] == 2
    store.finish("live2")
    store.finish("live1")
    assert store.stats()["prompts"] == 1


def test_max_answers_keeps_the_newest():
    prompt = [60, 61]
    store = DraftStore(max_answers=2)
    for i in range(3):
        store.start(f"a{i}", prompt)
        store.extend(f"a{i}", [10 * i + 1, 10 * i + 2, 10 * i + 3])
        store.finish(f"a{i}")
    assert store.stats()["answers"] == 2
    store.start("q", prompt)
    assert store.propose("q", [0, 1, 2], k=1) is None  # a0 dropped
    assert store.propose("q", [0, 11, 12], k=1) == Draft((13,), "history", 2)
    assert store.propose("q", [0, 21, 22], k=1) == Draft((23,), "history", 2)


def test_memory_bounded_over_many_requests():
    max_prompts, max_answers, n_values, max_prompt_len, max_answer_len = 4, 3, 3, 12, 40
    store = DraftStore(max_prompts=max_prompts, max_answers=max_answers, min_match=2, max_match=4)
    bound = max_prompts * n_values * (max_prompt_len + max_answers * max_answer_len)
    rng = random.Random(0)
    prompts = [[rng.randrange(6) for _ in range(rng.randrange(1, max_prompt_len + 1))] for _ in range(10)]
    for i in range(1000):
        rid = f"r{i}"
        store.start(rid, rng.choice(prompts))
        answer = [rng.randrange(6) for _ in range(rng.randrange(max_answer_len + 1))]
        for end in range(0, len(answer) + 1, 7):
            store.propose(rid, answer[:end], k=3)
        store.extend(rid, answer)
        store.finish(rid, keep=rng.random() < 0.8)
        stats = store.stats()
        assert stats["prompts"] <= max_prompts and stats["live"] == 0
        assert stats["ngrams"] <= stats["occurrences"] <= bound


def _naive(prompt, answers, requester, ctx, n_values, k):
    """Every (label, sequence, pos) whose n tokens before pos equal ctx's last n, for the largest n with any."""
    for n in sorted(n_values, reverse=True):
        if len(ctx) < n:
            continue
        key = ctx[-n:]
        found = [("prompt", prompt, pos) for pos in range(n, len(prompt)) if prompt[pos - n : pos] == key]
        for rid, (tokens, label) in answers.items():
            full = prompt + tokens
            for pos in range(max(len(prompt), n), len(full)):
                if full[pos - n : pos] == key:
                    found.append(("self" if rid == requester else label, full, pos))
        if found:
            return n, found
    return None, []


def _check_group(seed: int, cap: int, max_answers: int, exact: bool) -> int:
    rng = random.Random(seed)
    vocab = rng.choice((2, 3, 4))
    store = DraftStore(max_prompts=1000, max_answers=max_answers, min_match=2, max_match=4, max_occurrences=cap)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 9))] for _ in range(2)]
    live: dict[str, tuple[int, list[int], int]] = {}  # rid -> (prompt index, answer, start event)
    # per prompt's tokens (two equal prompts are one group): (answer, finish event), oldest first
    finished: dict[tuple[int, ...], list[tuple[list[int], int]]] = {tuple(q): [] for q in prompts}
    event, checked = 0, 0
    for step in range(120):
        event += 1
        if len(live) < 4 and rng.random() < 0.3:
            rid, p = f"r{step}", rng.randrange(2)
            store.start(rid, prompts[p])
            live[rid] = (p, [], event)
            continue
        if not live:
            continue
        rid = rng.choice(sorted(live))
        p, answer, started = live[rid]
        if rng.random() < 0.1:
            store.finish(rid)
            key = tuple(prompts[p])
            finished[key] = [*finished[key], (answer, event)][-max_answers:] if max_answers else []
            del live[rid]
            continue
        answer.extend(rng.randrange(vocab) for _ in range(rng.randrange(1, 4)))
        k = rng.randrange(1, 6)
        draft = store.propose(rid, answer, k)
        answers = {r: (a, "group") for r, (q, a, _) in live.items() if prompts[q] == prompts[p]}
        for i, (a, ended) in enumerate(finished[tuple(prompts[p])]):
            answers[f"done{i}"] = (a, "history" if ended < started else "group")
        n, found = _naive(prompts[p], answers, rid, prompts[p] + answer, (2, 3, 4), k)
        if n is None:
            assert draft is None
            continue
        assert draft is not None and draft.match == n and draft.source in SOURCES
        fits = [(lab, s, pos) for lab, s, pos in found if s[pos : pos + k] == list(draft.tokens)]
        assert any(lab == draft.source and len(draft.tokens) == min(k, len(s) - pos) for lab, s, pos in fits)
        if exact:  # the whole rule: the chosen occurrence has the best (votes, length, priority)
            votes = [s[pos] for _, s, pos in found]

            def score(lab, s, pos):
                return (votes.count(s[pos]), min(k, len(s) - pos), PRIORITY[lab])

            best = max(score(*o) for o in found)
            assert any(score(*o) == best for o in fits if o[0] == draft.source)
        checked += 1
    return checked


@pytest.mark.parametrize("seed", range(20))
def test_matches_naive_search_exactly_without_the_cap(seed):
    # a cap no key reaches: the whole rule, through finishes that drop the oldest answers
    assert _check_group(seed, cap=10_000, max_answers=2, exact=True) > 0


@pytest.mark.parametrize("seed", range(20))
def test_matches_naive_search_n_and_continuation_with_the_cap(seed):
    # the default cap: the same n and a real continuation of that n-gram (no answer dropped)
    assert _check_group(seed, cap=8, max_answers=1000, exact=False) > 0


def test_a_group_of_eight_long_answers_stays_cheap():
    rng = random.Random(1)
    prompt = [rng.randrange(50) for _ in range(300)]
    store = DraftStore()
    for i in range(8):
        store.start(f"a{i}", prompt)
        store.extend(f"a{i}", [rng.randrange(50) for _ in range(200)])
    store.start("q", prompt)
    answer: list[int] = []
    for _ in range(200):
        answer.append(rng.randrange(50))
        draft = store.propose("q", answer, k=4)
        assert draft is None or 1 <= len(draft.tokens) <= 4
    assert store.stats()["answers"] == 9
