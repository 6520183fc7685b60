"""reasoning-gym's procedural tasks as datasets: `reasoning_gym:<dataset>?size=N&seed=S&<option>=...`.

Why a dataset name and not a file: reasoning-gym (on PyPI) generates 100+ tasks offline from a
seed, each with its own scorer. A workflow names one where it names a file:

    data:
      train: reasoning_gym:basic_arithmetic?size=2000&seed=1
      eval:  reasoning_gym:basic_arithmetic?size=200&seed=2

and the run (and `areal-graph eval`) sees an ordinary JSONL file: `materialize` writes the rows
once into the kit cache (`$AREAL_GRAPH_CACHE/reasoning_gym/`), named by the spec's hash, so every
process reads the same problems. Each row's `answer` carries what the task's own scorer needs
(the dataset name and the whole entry, as JSON): the builtin reward `fn: reasoning_gym`
(nodes/reasoning_gym_reward.py) calls that dataset's `score_answer` on the model's final answer.
Query options other than size and seed go to the dataset's config (numbers, true/false, text,
comma-separated lists: `operators=+,-`; '+' is a plus sign here, not a space).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from areal_graph.data.arith import write_jsonl

SCHEME = "reasoning_gym:"
PIP = "pip install 'reasoning-gym>=0.1.25,<0.2'"
DEFAULT_SIZE = 1000
MAX_SIZE = 200_000  # rows are generated eagerly: bound the time and the file


class ReasoningGymError(ValueError):
    """A reasoning_gym: spec that cannot be served (unknown dataset, bad option, not installed)."""


def is_spec(path: Any) -> bool:
    return str(path).startswith(SCHEME)


def _value(text: str) -> Any:
    """A query value as the config wants it: int, float, bool, or the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`reasoning_gym:name?k=v&...` -> (name, config kwargs with size and seed filled in)."""
    if not is_spec(spec):
        raise ReasoningGymError(f"{spec!r} is not a {SCHEME}<dataset> name")
    name, _, query = str(spec)[len(SCHEME) :].partition("?")
    if not name:
        raise ReasoningGymError(f"{spec!r}: give a dataset, e.g. {SCHEME}basic_arithmetic?size=2000&seed=1")
    pairs = [part.partition("=") for part in query.split("&")] if query else []
    if any(not k or not sep for k, sep, _ in pairs):
        raise ReasoningGymError(f"{spec!r}: options must look like ?size=2000&seed=1")
    # '+' stays '+' (operators=+,-), unlike form decoding; a comma separates a list's items
    kwargs = {
        unquote(k): ([_value(unquote(x)) for x in v.split(",")] if "," in v else _value(unquote(v)))
        for k, _, v in pairs
    }
    kwargs.setdefault("size", DEFAULT_SIZE)
    kwargs.setdefault("seed", 0)
    size = kwargs["size"]
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_SIZE:
        raise ReasoningGymError(f"{spec!r}: size must be an integer in [1, {MAX_SIZE}], got {size!r}")
    if not isinstance(kwargs["seed"], int) or isinstance(kwargs["seed"], bool):
        raise ReasoningGymError(f"{spec!r}: seed must be an integer, got {kwargs['seed']!r}")
    return name, kwargs


def _library() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ReasoningGymError(f"reasoning_gym: datasets need the reasoning-gym package: {PIP}") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    _library()
    return sorted(DATASETS)


def check_spec(spec: str) -> str | None:
    """What is wrong with `spec` (None: it can be served), cheaply: the name is known and the
    options build its config. For `areal-graph validate`, before any process starts."""
    try:
        name, kwargs = parse_spec(spec)
        _library()
        names = dataset_names()
        if name not in names:
            near = difflib.get_close_matches(name, names, n=3)
            return (
                f"{spec!r}: reasoning-gym has no dataset {name!r}"
                + (f" (did you mean {', '.join(repr(n) for n in near)}?)" if near else "")
                + f"; it has {len(names)}: {', '.join(names)}"
            )
        _config(name, kwargs)
    except ReasoningGymError as err:
        return str(err)
    return None


def _config(name: str, kwargs: dict[str, Any]) -> Any:
    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[name][1]
    defaults = {f.name: f.default for f in getattr(config_cls, "__dataclass_fields__", {}).values()}
    # a one-item list given without a comma (operators=+) is still a list where the config has one
    kwargs = {
        k: [v] if isinstance(defaults.get(k), (list, tuple)) and not isinstance(v, list) else v
        for k, v in kwargs.items()
    }
    try:
        config = config_cls(**kwargs)
        if hasattr(config, "validate"):
            config.validate()
    except (TypeError, ValueError, AssertionError) as err:
        fields = sorted(getattr(config_cls, "__dataclass_fields__", {}))
        raise ReasoningGymError(f"reasoning_gym:{name}: its options are {', '.join(fields)}; {err}") from None
    return config


def answer_payload(name: str, entry: dict[str, Any]) -> str:
    """A row's `answer`: the dataset and the entry its scorer reads, as JSON ('#' escaped: the
    dataset reader takes text after '####' as a GSM8K answer)."""
    return json.dumps({"reasoning_gym": name, "entry": entry}, default=str, separators=(",", ":")).replace(
        "#", "\\u0023"
    )


def cache_path(spec: str, root: Path) -> Path:
    """Where `spec`'s rows are written under `root` (named by the spec's hash and the library's version)."""
    name, kwargs = parse_spec(spec)
    version = getattr(_library(), "__version__", "")
    key = hashlib.sha256(json.dumps([name, sorted(kwargs.items()), version], default=str).encode()).hexdigest()[:12]
    return root / "reasoning_gym" / f"{name}-{key}.jsonl"


def _row(name: str, seed: int, i: int, entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"{name}-{seed}-{i}",
        "question": entry["question"],
        "answer": answer_payload(name, entry),
        "data_source": f"reasoning_gym/{name}",
    }


def materialize(spec: str, root: Path) -> Path:
    """The JSONL file of `spec`'s rows under `root` (written once; later calls reuse it)."""
    problem = check_spec(spec)
    if problem:
        raise ReasoningGymError(problem)
    name, kwargs = parse_spec(spec)
    path = cache_path(spec, root)
    if path.is_file():
        return path
    rows = (_row(name, kwargs["seed"], i, entry) for i, entry in enumerate(entries(spec)))
    return write_jsonl(rows, path)  # atomic: a concurrent reader never sees half a file


def sample_rows(spec: str, n: int) -> list[dict[str, Any]]:
    """The first `n` rows of `spec`, as `materialize` writes them, without writing the file (what
    `validate` renders to see whether the prompts fit the model's context)."""
    name, kwargs = parse_spec(spec)
    return [_row(name, kwargs["seed"], i, entry) for i, entry in zip(range(n), entries(spec))]


def entries(spec: str) -> Iterator[dict[str, Any]]:
    """The entries `spec` names (question, answer, metadata), as reasoning-gym generates them."""
    name, kwargs = parse_spec(spec)
    problem = check_spec(spec)
    if problem:
        raise ReasoningGymError(problem)
    dataset = _library().create_dataset(name, **kwargs)
    return (dataset[i] for i in range(len(dataset)))


def display_answer(answer: str) -> str:
    """The reference answer as a person reads it: the task's own answer for a reasoning-gym row,
    else `answer` unchanged."""
    if not answer.startswith('{"reasoning_gym"'):
        return answer
    try:
        return str(json.loads(answer)["entry"]["answer"])
    except (ValueError, KeyError, TypeError):
        return answer
