"""Constrained decoding in the embedded engine: a token mask per step from a JSON schema or a
Lark grammar, computed by llguidance (the grammar engine vLLM and SGLang offer as a backend).

Why llguidance and not our own automaton: JSON Schema alone (anyOf, $ref, string formats,
numbers) is months of work to get right, and the mask must be computed against the tokenizer's
real byte strings (a token may close a string and open a key at once). llguidance does both,
has no Python dependencies (one ~3 MB wheel), and bounds its own time and memory on hostile
grammars (a 2,000-deep schema is refused in milliseconds with "recursion limit exceeded").

A request's `SamplingParams.json_schema` (SGLang's field: a JSON Schema as a string) or
`SamplingParams.grammar` (a Lark grammar in llguidance's dialect, which may embed `%json {...}`)
becomes one `TokenConstraint`. At each step the engine sets the logits of every token the
grammar forbids to -inf *before* sampling, so the reported log-prob is the one the token was
really drawn with (the masked, temperature-scaled distribution), then feeds the token to the
constraint. Where the grammar may end or go on, end-of-sequence is one of the allowed tokens;
where it must end, the request finishes at once (finish reason "stop", no EOS token appended).

Training: a token the grammar left as the only choice (`<tool_call>`, a key name, a closing
brace) was forced, not chosen by the policy, so it is flagged (`GenerationResult.output_forced`)
and the recording client keeps it in the trajectory as context (loss mask 0). A token drawn
from several allowed ones is trained, with the masked distribution's log-prob as its
behaviour log-prob: the decoupled-PPO weight pi / mu then corrects for the mask. A rollout's
`sampling` refuses the fields.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ConstraintCompiler", "ConstraintError", "TokenConstraint", "apply_masks"]


class ConstraintError(ValueError):
    """A schema or grammar that cannot be compiled, or a tokenizer llguidance cannot read."""


class TokenConstraint:
    """One request's position in its grammar: which tokens may come next, and feeding it tokens."""

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self._matcher = matcher
        self.n_vocab = n_vocab
        self._bits = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """A bool mask [n_vocab] (on the host) of the tokens the grammar allows next."""
        import llguidance.torch as llt

        words = llt.allocate_token_bitmask(1, self.n_vocab)
        llt.fill_next_token_bitmask(self._matcher, words, 0)
        unpacked = (words[0].unsqueeze(-1) >> self._bits) & 1
        return unpacked.view(-1)[: self.n_vocab].bool()

    def advance(self, token: int) -> None:
        """Feed the sampled token. A token the mask allowed is always accepted; anything else is a bug."""
        if not self._matcher.consume_token(int(token)):
            raise ConstraintError(f"the grammar refused token {token}: {self._matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar is complete and nothing but end-of-sequence may follow: the answer is done
        (ending it here saves the step that would only sample EOS)."""
        return bool(self._matcher.is_stopped())


class ConstraintCompiler:
    """Compiles requests' schemas and grammars against one tokenizer (built once: ~10 ms for a
    small vocabulary, longer for a 150k one, so never per request).

    Compiled grammars are kept (the `CACHED` most recent): an agent sends the same tools every
    turn, a chat's `n` choices share one, and the server checks a request's grammar before
    submitting it. Each request gets a copy of the untouched matcher (`deep_copy`)."""

    CACHED = 64

    def __init__(self, tokenizer: Any, n_vocab: int, eos_ids: Sequence[int]) -> None:
        self.n_vocab = int(n_vocab)
        self._tokenizer = tokenizer
        self._eos = [int(t) for t in eos_ids]
        self._lltok: Any = None
        self._lock = threading.Lock()
        self._compiled: collections.OrderedDict[tuple[str | None, str | None], Any] = collections.OrderedDict()

    def _ll_tokenizer(self) -> Any:
        with self._lock:
            if self._lltok is None:
                try:
                    import llguidance.hf
                except ImportError as err:  # a dependency of the package: only a broken install lacks it
                    raise ConstraintError(
                        "constrained decoding needs llguidance: pip install 'llguidance>=1.2'"
                    ) from err
                if self._tokenizer is None:
                    raise ConstraintError("this server has no tokenizer, so it cannot constrain its output")
                try:
                    self._lltok = llguidance.hf.from_tokenizer(
                        self._tokenizer, n_vocab=self.n_vocab, eos_token=self._eos or None
                    )
                except Exception as err:  # a slow (Python) tokenizer, or one llguidance cannot read
                    raise ConstraintError(
                        f"constrained decoding cannot read this model's tokenizer "
                        f"({type(self._tokenizer).__name__}): {err}"
                    ) from err
            return self._lltok

    def compile(self, json_schema: str | None = None, grammar: str | None = None) -> TokenConstraint:
        """The constraint for a request's `json_schema` or `grammar` (exactly one is given)."""
        key = (json_schema, grammar)
        with self._lock:
            pristine = self._compiled.get(key)
            if pristine is not None:
                self._compiled.move_to_end(key)
        if pristine is None:
            pristine = self._matcher(json_schema, grammar)
            with self._lock:
                self._compiled[key] = pristine
                while len(self._compiled) > self.CACHED:
                    self._compiled.popitem(last=False)
        return TokenConstraint(pristine.deep_copy(), self.n_vocab)

    def _matcher(self, json_schema: str | None, grammar: str | None) -> Any:
        """A fresh llguidance matcher at the grammar's start, or ConstraintError saying why not."""
        import llguidance

        if (json_schema is None) == (grammar is None):
            raise ConstraintError("give exactly one of json_schema and grammar")
        if json_schema is not None:
            try:
                schema = json.loads(json_schema)
            except ValueError as err:
                raise ConstraintError(f"json_schema is not valid JSON: {err}") from None
            except RecursionError:
                raise ConstraintError("json_schema is nested too deeply") from None
            if schema is True:  # JSON Schema's "anything"
                schema = {}
            if not isinstance(schema, dict):
                raise ConstraintError(f"json_schema must be a JSON object, got {json.dumps(schema)[:40]}")
            source = llguidance.LLMatcher.grammar_from_json_schema(schema)
        else:
            source = llguidance.LLMatcher.grammar_from_lark(str(grammar))
        matcher = llguidance.LLMatcher(self._ll_tokenizer(), source, log_level=0)
        if matcher.is_error():
            what = "json_schema" if json_schema is not None else "grammar"
            raise ConstraintError(f"{what} cannot be used: {matcher.get_error()}")
        return matcher


def apply_masks(
    logits: torch.Tensor, constraints: Sequence[TokenConstraint | None]
) -> tuple[torch.Tensor, list[bool | None]]:
    """`logits` [B, V] with every token a row's constraint forbids set to -inf (rows without one
    unchanged: a new tensor when any row is constrained, else `logits` itself), and per row
    whether its constraint left a single token (forced; None for an unconstrained row)."""
    forced: list[bool | None] = [None] * len(constraints)
    rows = [j for j, c in enumerate(constraints) if c is not None]
    if not rows:
        return logits, forced
    width = logits.shape[1]
    masks = []
    for j in rows:
        allowed = constraints[j].allowed()  # type: ignore[union-attr]
        if allowed.shape[0] < width:  # padded vocabulary rows the tokenizer never produces
            allowed = torch.cat([allowed, allowed.new_zeros(width - allowed.shape[0])])
        masks.append(allowed[:width])
    allowed = torch.stack(masks)
    for j, n in zip(rows, allowed.sum(dim=1).tolist()):
        forced[j] = n == 1
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    out = logits.clone()
    out[index] = out.index_select(0, index).masked_fill(~allowed.to(logits.device), float("-inf"))
    return out, forced
