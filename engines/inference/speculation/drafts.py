"""Draft tokens by suffix matching (prompt lookup and group lookup), for verification by the engine.

Why no draft model: in RL rollouts the G answers to one prompt are generated together and
resemble one another (same opening, same restated facts, same formulas), answers copy spans of
their prompt, and the same prompts return across RL steps. So the cheapest good guess of the
next tokens is what followed the current last n tokens elsewhere in that material. The engine
checks every proposal with the target model, so a bad guess costs a little compute and never
changes the output: this module optimises for acceptance and per-call speed, not correctness.

How: one `_Group` per distinct prompt (its token tuple is the key, hashed once in `start`). A
group holds an n-gram index for n in [min_match, max_match]: n tokens -> occurrences (sequence,
position), where the position is that of the token that FOLLOWED the n-gram. An occurrence is
indexed only once its next token exists, so every indexed occurrence has a continuation and a
request's own current suffix (nothing after it yet) is never a candidate, with no check at
lookup. Answers are indexed with the prompt's last max_match tokens in front, so n-grams that
cross the prompt/answer boundary match too: with an empty answer the last n prompt tokens find
how the group's other answers began, which is where answers of one prompt agree most.

Each key keeps only its newest `max_occurrences` occurrences (trimmed in bulk, amortised O(1)),
so a common n-gram costs the same as a rare one. Dropping an answer removes exactly its own
occurrences; an n-gram whose kept occurrences all came from the dropped answer loses older
occurrences that the cap had already discarded (a missed proposal, never a wrong result).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

SOURCES = ("self", "prompt", "group", "history")  # where an accepted draft came from
# Ties after the vote and the continuation length: an answer of the same prompt in flight is the
# best predictor (same sampling step, same weights), then a kept one, then the request itself.
_PRIORITY = {"group": 3, "history": 2, "self": 1, "prompt": 0}


@dataclass(frozen=True)
class Draft:
    """Up to k proposed next tokens; `source` (one of SOURCES) and `match` (the matched n) for the trace."""

    tokens: tuple[int, ...]
    source: str
    match: int = 0


class _Seq:
    """One indexed sequence: the prompt (base 0) or an answer behind the prompt's tail (base = tail length)."""

    __slots__ = ("buf", "base", "started", "finished", "is_prompt")

    def __init__(self, buf: list[int], base: int, started: int, is_prompt: bool = False) -> None:
        self.buf = buf
        self.base = base  # buf[base:] is the sequence's own tokens; only positions >= base are indexed
        self.started = started
        self.finished: int | None = None
        self.is_prompt = is_prompt


class _Group:
    """All sequences of one prompt and their shared n-gram index."""

    __slots__ = ("key", "prompt", "index", "kept", "live", "used")

    def __init__(self, key: tuple[int, ...], used: int) -> None:
        self.key = key
        self.prompt = _Seq(list(key), 0, used, is_prompt=True)
        self.index: dict[tuple[int, ...], list[tuple[_Seq, int]]] = {}
        self.kept: deque[_Seq] = deque()  # finished answers kept, oldest first
        self.live = 0
        self.used = used


class DraftStore:
    """Proposes drafts for live requests from their prompt group's sequences; bounded in memory.

    `max_prompts` groups are kept (the least recently used one without a live request is evicted
    first), each with at most `max_answers` finished answers (the newest). Live requests and their
    groups are never evicted, so the bound holds once the engine is idle.
    """

    def __init__(
        self,
        max_prompts: int = 128,
        max_answers: int = 8,
        min_match: int = 2,
        max_match: int = 4,
        max_occurrences: int = 8,
    ) -> None:
        for name, value, low in (
            ("max_prompts", max_prompts, 1),
            ("max_answers", max_answers, 0),
            ("min_match", min_match, 1),
            ("max_occurrences", max_occurrences, 1),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(max_match, int) or max_match < min_match:
            raise ValueError(f"max_match must be an int >= min_match ({min_match}), got {max_match!r}")
        self.max_prompts = max_prompts
        self.max_answers = max_answers
        self.min_match = min_match
        self.max_match = max_match
        self.max_occurrences = max_occurrences
        self._ns = tuple(range(min_match, max_match + 1))
        self._groups: dict[tuple[int, ...], _Group] = {}
        self._live: dict[str, tuple[_Group, _Seq]] = {}
        self._tick = 0  # logical clock: LRU order, and "finished before this request started"

    def start(self, rid: str, prompt: Sequence[int]) -> None:
        """A request (one answer) of `prompt` starts; its group is found by the prompt's tokens."""
        if rid in self._live:
            raise ValueError(f"request {rid!r} is live already")
        self._tick += 1
        key = tuple(prompt)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key, self._tick)
            self._index(group, group.prompt, 0)
        group.live += 1
        group.used = self._tick
        tail = list(key[-self.max_match :]) if key else []
        self._live[rid] = (group, _Seq(tail, len(tail), self._tick))
        self._evict()

    def extend(self, rid: str, output_ids: Sequence[int], upto: int | None = None) -> None:
        """Index the tokens of `output_ids` (the whole answer so far) not indexed yet: O(new tokens).
        `upto`: index only `output_ids[:upto]` (tokens indexed beyond it already stay).

        A shorter answer than indexed, or a different last indexed token, means the answer was
        restarted: it is re-indexed from scratch rather than trusted.
        """
        group, seq = self._live[rid]
        have = len(seq.buf) - seq.base
        n_out = len(output_ids)
        if have and (n_out < have or output_ids[have - 1] != seq.buf[-1]):
            self._unindex(group, seq)
            del seq.buf[seq.base :]
            have = 0
        n = n_out if upto is None else min(upto, n_out)
        if n > have:
            first = len(seq.buf)
            seq.buf.extend(output_ids[have:n])
            self._index(group, seq, first)

    def propose(self, rid: str, output_ids: Sequence[int], k: int) -> Draft | None:
        """Up to k tokens to follow prompt + output_ids, or None when no n-gram of the tail matches.

        The longest matching n wins; among its occurrences the next token most of them agree on,
        then the longest continuation (up to k), then the source priority, then the newest.
        """
        self.extend(rid, output_ids)
        group, seq = self._live[rid]
        self._tick += 1
        group.used = self._tick
        if k < 1:
            return None
        buf = seq.buf  # the prompt's tail + the answer: the context's tail without concatenating
        for n in reversed(self._ns):
            if len(buf) < n:
                continue
            occurrences = group.index.get(tuple(buf[-n:]))
            if occurrences:
                return self._choose(seq, occurrences[-self.max_occurrences :], k, n)
        return None

    def finish(self, rid: str, keep: bool = True) -> None:
        """The request is done: keep its answer as a finished answer of its prompt, or drop it."""
        entry = self._live.pop(rid, None)
        if entry is None:
            return
        group, seq = entry
        self._tick += 1
        seq.finished = self._tick
        group.live -= 1
        if keep and self.max_answers:
            group.kept.append(seq)
            while len(group.kept) > self.max_answers:
                self._unindex(group, group.kept.popleft())
        else:
            self._unindex(group, seq)
        self._evict()

    def stats(self) -> dict[str, int]:
        """Counts for tests and memory bounds: groups, answers (kept + live), distinct n-grams, occurrences."""
        groups = self._groups.values()
        return {
            "prompts": len(self._groups),
            "answers": sum(len(g.kept) for g in groups) + len(self._live),
            "live": len(self._live),
            "ngrams": sum(len(g.index) for g in groups),
            "occurrences": sum(len(occ) for g in groups for occ in g.index.values()),
        }

    def _choose(self, requester: _Seq, candidates: list[tuple[_Seq, int]], k: int, n: int) -> Draft:
        """The rule of `propose` over one n's candidates (newest last)."""
        votes: dict[int, int] = {}
        for s, pos in candidates:
            token = s.buf[pos]
            votes[token] = votes.get(token, 0) + 1
        best: tuple[int, int, int, int] | None = None
        chosen = candidates[-1]
        for recency, (s, pos) in enumerate(candidates):
            score = (votes[s.buf[pos]], min(k, len(s.buf) - pos), _PRIORITY[self._source(requester, s)], recency)
            if best is None or score > best:
                best, chosen = score, (s, pos)
        s, pos = chosen
        return Draft(tuple(s.buf[pos : pos + k]), self._source(requester, s), n)

    @staticmethod
    def _source(requester: _Seq, s: _Seq) -> str:
        """The label of `s` relative to the requester: "history" is what finished before it started."""
        if s is requester:
            return "self"
        if s.is_prompt:
            return "prompt"
        if s.finished is not None and s.finished < requester.started:
            return "history"
        return "group"

    def _index(self, group: _Group, seq: _Seq, first: int) -> None:
        """Index every position >= first of seq: the n-grams that end right before it."""
        index, buf, cap = group.index, seq.buf, self.max_occurrences
        for pos in range(max(first, seq.base), len(buf)):
            for n in self._ns:
                if n > pos:
                    break
                key = tuple(buf[pos - n : pos])
                occurrences = index.get(key)
                if occurrences is None:
                    index[key] = [(seq, pos)]
                else:
                    occurrences.append((seq, pos))
                    if len(occurrences) > 2 * cap:  # bulk trim: amortised O(1) per append
                        del occurrences[:-cap]

    def _unindex(self, group: _Group, seq: _Seq) -> None:
        """Remove seq's occurrences from its group's index: O(its length x the cap)."""
        index, buf = group.index, seq.buf
        done: set[tuple[int, ...]] = set()
        for pos in range(seq.base, len(buf)):
            for n in self._ns:
                if n > pos:
                    break
                key = tuple(buf[pos - n : pos])
                if key in done:
                    continue
                done.add(key)
                occurrences = index.get(key)
                if occurrences is None:
                    continue
                kept = [o for o in occurrences if o[0] is not seq]
                if kept:
                    index[key] = kept
                else:
                    del index[key]

    def _evict(self) -> None:
        """Drop least recently used groups without live requests until at most max_prompts remain."""
        while len(self._groups) > self.max_prompts:
            idle = [g for g in self._groups.values() if not g.live]
            if not idle:
                return  # every group has a request in flight: over the bound until one finishes
            del self._groups[min(idle, key=lambda g: g.used).key]
