"""Whether a workflow's prompts fit its policy's context: checked by `validate`, and by `run` before
it starts anything.

Why: the inference server refuses a request whose prompt + `max_new_tokens` passes the model's
context, every time; a run with such prompts fails its prompt groups one after another and stops
minutes in, with the server's words ("prompt (343 tokens) + sampling_params.max_new_tokens (8)
exceeds the model context of 256 tokens"). Here each dataset's prompts are rendered as the run
renders them (data/prompt_lengths.py: a bounded sample, games' openings included) with the
policy's template and tokenizer, and measured against its context: an error names the dataset,
the longest prompt and what to change.

Nothing is downloaded or built: a builtin kit's tokenizer comes from the kit cache once built
(before that the check waits for `run`, which builds it), a hub id's from the local Hugging Face
cache only.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from areal_graph.data import generated
from areal_graph.data.dataset_files import DatasetError
from areal_graph.data.prompt_lengths import PromptLengths, measure
from areal_graph.engines.inference.backends import get_backend
from areal_graph.graph.kinds.common import actor_model
from areal_graph.graph.kinds.registry import kind_of
from areal_graph.modelkit.builtin import PREFIX, built_dataset_path, built_model_dir, cache_root, model_context


@dataclass
class PromptCheck:
    """The outcome: `problems` (errors, a line each), `lines` (what was measured, or why not), and
    whether everything could be checked here (False: a kit not built yet; `run` checks again after
    building it)."""

    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    complete: bool = True


def _tokenizer(path: str) -> tuple[Any | None, str | None]:
    """The policy's tokenizer from local files only, or why there is none here yet."""
    from transformers import AutoTokenizer

    local = built_model_dir(path)
    if local is None and str(path).startswith(PREFIX):
        return None, f"{path} is not built yet (the run builds it, then checks)"
    try:
        return AutoTokenizer.from_pretrained(str(local or path), local_files_only=True), None
    except (OSError, ValueError) as err:
        return None, f"no tokenizer of {path} on this machine ({type(err).__name__})"


def _excerpt(text: str, n: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 3] + "..."


def check_prompts(spec: Any) -> PromptCheck:
    """Measure every dataset of `spec` (a WorkflowSpec) against the policy's context."""
    out = PromptCheck()
    actor = actor_model(spec)
    source = next((n for n in spec.nodes.values() if kind_of(n).source), None)
    sampling = getattr(getattr(source, "params", None), "sampling", None)
    if actor is None or source is None or sampling is None:
        out.lines.append("prompts: not checked (no policy, or no rollout with a sampling length)")
        return out
    model = spec.models[actor]
    backend = get_backend(spec.inference.backend)
    limit, own = backend.context_limit(spec.inference), model_context(model.path)
    context = limit if limit is not None else own
    if context is None:
        out.lines.append(f"prompts: not checked (the context of models.{actor} ({model.path}) is not known here)")
        return out
    where = (
        f"the {limit}-token context inference.args.{backend.context_arg} sets"
        if limit is not None
        else f"the {context}-token context of models.{actor} ({model.path})"
    )
    tokenizer, why = _tokenizer(model.path)
    if tokenizer is None:
        out.lines.append(f"prompts: not checked yet: {why}")
        out.complete = False
        return out
    max_new = int(sampling.max_new_tokens)
    limits = _Limits(context, where, max_new, f"nodes.{source.name}.sampling.max_new_tokens", limit, own, backend)
    for name, dataset in (("data.train", spec.data.train), ("data.eval", spec.data.eval)):
        if not dataset:
            continue
        path = built_dataset_path(str(dataset))
        if path is None and generated.source_of(dataset) is None:
            out.lines.append(f"prompts: {name} not checked yet: its kit is not built (the run builds it, then checks)")
            out.complete = False
            continue
        try:
            found = measure(str(dataset), path, tokenizer, spec.data, cache_root())
        except (DatasetError, ValueError, OSError, subprocess.TimeoutExpired) as err:
            out.lines.append(f"prompts: {name} not checked ({err})")  # the dataset checks say what is wrong
            continue
        if found is None:
            out.lines.append(f"prompts: {name} not checked (no usable row in the sample)")
            continue
        _judge(out, f"{name} ({dataset})", found, spec.data, limits)
    return out


@dataclass(frozen=True)
class _Limits:
    context: int
    where: str  # what sets the context, in words
    max_new: int
    max_new_field: str
    limit: int | None  # inference.args' cap, if any
    own: int | None  # the model's own context, if known
    backend: Any


def _judge(out: PromptCheck, name: str, found: PromptLengths, data: Any, lim: _Limits) -> None:
    """Add `found`'s verdict to `out`: a problem when a sampled prompt cannot fit, else a line."""
    cap = data.max_prompt_tokens
    kept = [n for n in found.lengths if cap is None or n <= cap]
    if not kept:
        out.problems.append(
            f"{name}: every sampled prompt ({found.sample}) is longer than data.max_prompt_tokens ({cap}), "
            f"the shortest {min(found.lengths)} tokens: the run would skip every row; raise data.max_prompt_tokens "
            "or shorten data.prompt_template"
        )
        return
    room = lim.context - lim.max_new
    over = [n for n in kept if n > room]
    longest = max(kept)
    if not over:
        out.lines.append(
            f"prompts: {name}: the longest of {len(kept)} ({found.sample}) is {longest} tokens + "
            f"{lim.max_new} new = {longest + lim.max_new}, within {lim.where}"
        )
        return
    fixes = []
    if longest < lim.context:
        fixes.append(f"lower {lim.max_new_field} to at most {lim.context - longest}")
    if room > 0 and len(over) < len(kept):
        fixes.append(f"set data.max_prompt_tokens: {room} (longer prompts are skipped, and counted)")
    if data.prompt_template:
        fixes.append("shorten data.prompt_template")
    if lim.limit is not None and lim.own is not None and lim.own > lim.limit:
        fixes.append(f"raise inference.args.{lim.backend.context_arg} toward the model's {lim.own}")
    fixes.append("use a model with a longer context")
    named = f"{found.longest_id!r} ({_excerpt(found.longest_question)!r}), " if max(found.lengths) == longest else ""
    out.problems.append(
        f"{name}: the longest sampled prompt, {named}is {longest} tokens with the template and chat template; "
        f"with {lim.max_new_field} {lim.max_new} it needs {longest + lim.max_new}, past {lim.where}, and the "
        f"server refuses such a request every time ({len(over)} of {len(kept)} sampled prompts, {found.sample}, "
        "do not fit). Change one: " + "; ".join(fixes)
    )
