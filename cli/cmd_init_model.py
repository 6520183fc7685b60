"""`areal-graph init-model`: build the builtin tiny-model kit (offline, deterministic, cached)."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.markup import escape


@contextlib.contextmanager
def kit_progress(console: Console) -> Iterator[Callable[[str], None]]:
    """A `progress` callback for building a kit: a spinner with the current stage, and each
    stage printed with the time, so the minutes of a first build are visibly moving."""
    with console.status("preparing the builtin kit ...") as status:

        def progress(msg: str) -> None:
            status.update(msg)
            console.print(f"[dim]{time.strftime('%X')}[/] {escape(msg)}", highlight=False)  # paths may hold [...]

        yield progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "init-model",
        help="build the builtin tiny model kit (tokenizer, data, model, SFT warm start)",
        description=(
            "Make builtin:tiny-arith (or another builtin kit) with no network: a synthetic multi-step "
            "arithmetic dataset (train/test JSONL with a short chain of thought and a final \\boxed{} "
            "answer), a byte-level BPE tokenizer trained on it, a tiny Qwen2 CausalLM, and a short SFT warm "
            "start that leaves room for RL. The tiny-arith warm start the README measured is shipped with "
            "the package (checked by SHA-256) and installed in a second; --from-recipe builds it from its "
            "recipe instead (about 2 minutes on 2 cores; any build of the recipe learns, but its floats depend "
            "on the machine). Cached under $AREAL_GRAPH_CACHE (default ~/.cache/areal-graph): a second call "
            "is instant. `areal-graph run` does this on first use anyway; this command does it up front "
            "and shows where it went."
        ),
        epilog="Example: areal-graph init-model && areal-graph eval builtin:tiny-arith --data builtin:arith/test",
    )
    p.add_argument("name", nargs="?", default="tiny-arith", help="builtin kit to build (default tiny-arith)")
    p.add_argument("--rebuild", action="store_true", help="make the kit again even if a cached kit exists")
    p.add_argument(
        "--from-recipe",
        action="store_true",
        help="build from the recipe even where a shipped warm start exists (replaces a cached kit)",
    )
    p.add_argument("--json", action="store_true", help="print the kit's metadata as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from areal_graph.modelkit.builtin import BUILTIN_KITS, BUILTIN_REWARD_MODELS, ensure_kit, load_kit

    console = Console(stderr=True, soft_wrap=True)
    name = args.name.removeprefix("builtin:")
    if name in BUILTIN_REWARD_MODELS:
        return _reward_model(name, args, console)
    if name not in BUILTIN_KITS:
        console.print(
            f"[red]unknown builtin kit {args.name!r}; choose one of "
            f"{', '.join([*BUILTIN_KITS, *BUILTIN_REWARD_MODELS])}[/]"
        )
        return 2
    rebuild = args.rebuild or args.from_recipe
    made = rebuild or load_kit(BUILTIN_KITS[name]) is None
    t0 = time.perf_counter()
    with kit_progress(console) as progress:
        kit = ensure_kit(BUILTIN_KITS[name], rebuild=rebuild, from_recipe=args.from_recipe, progress=progress)
    info = kit.info
    if args.json:
        Console().print_json(json.dumps(info))
        return 0
    seconds = time.perf_counter() - t0
    how = ("installed (shipped)" if info.get("source") == "shipped" else "built from the recipe") if made else "cached"
    console.print(f"[bold green]{name}[/] {how} in {seconds:.1f} s at {kit.path}")
    console.print(
        f"  model     {kit.model_dir}  ({info['parameters'] / 1e6:.2f}M parameters, vocab {info['vocab_size']})",
        highlight=False,
    )
    console.print(f"  train     {kit.data_path('train')}", highlight=False)
    console.print(f"  test      {kit.data_path('test')}", highlight=False)
    console.print(
        f"  warm start: greedy accuracy {info['warm_start_greedy_accuracy']:.1%} on "
        f"{info['eval_prompts']} test problems; built in {info['timings']['total_s']:.0f} s on "
        f"{info.get('built_on', 'an unrecorded machine')}",
        highlight=False,
    )
    return 0


def _reward_model(name: str, args: argparse.Namespace, console: Console) -> int:
    """A builtin reward model (e.g. tiny-arith-rm, which workflows, `eval` and `serve` accept):
    built from its policy kit on first use like a kit, cached, its path shown."""
    from areal_graph.modelkit.builtin import BUILTIN_REWARD_MODELS
    from areal_graph.modelkit.reward_model import ensure_reward_model

    if args.rebuild or args.from_recipe:
        console.print(
            f"[red]--rebuild / --from-recipe are for policy kits; {name} is a reward model, rebuilt "
            "when its recipe changes (delete its cache folder to force it)[/]"
        )
        return 2
    t0 = time.perf_counter()
    with kit_progress(console) as progress:
        path = ensure_reward_model(BUILTIN_REWARD_MODELS[name], progress=progress)
    if args.json:
        Console().print_json((path / "reward_model.json").read_text())
        return 0
    console.print(
        f"[bold green]{name}[/] (reward model) ready in {time.perf_counter() - t0:.1f} s at {path}", highlight=False
    )
    return 0
