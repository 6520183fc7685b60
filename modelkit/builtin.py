"""The builtin model kits, built locally: `builtin:tiny-arith` with `builtin:arith/{train,test}`
(2-3 step arithmetic), `builtin:tiny-arith-long` with `builtin:arith-long/{train,test}` (1 to
20 steps, long-tailed answer lengths: the regime where asynchronous RL pays most), and
`builtin:tiny-calc` with `builtin:calc/{train,test}` (products answered with a calculator
tool: multi-turn tool use).

Nothing may be downloaded, yet a new user's first `areal-graph run` needs a model that solves
the task *some* of the time. So the kit is built on first use, offline and deterministically:
a synthetic arithmetic dataset, a byte-level BPE tokenizer trained on it, a tiny Qwen2
model, and a short SFT warm start. It lands in a cache directory named after a fingerprint
of everything that shapes it, so a second resolve is instant and a changed recipe never
reuses a stale build.

Layout of one kit (`<cache>/<name>-<fingerprint>/`, e.g. `tiny-arith-43a2521c751c/`):

    model/        save_pretrained model + tokenizer (loads with AutoModelForCausalLM/AutoTokenizer)
    data/         train.jsonl, test.jsonl  ({"question", "answer", "solution"})
    kit.json      the recipe, sizes, build time and warm-start accuracy

Several processes of one run may resolve the same name at once (controller, servers,
workers): an exclusive file lock makes exactly one of them build; the others wait and reuse.
A build goes to a temporary directory renamed into place, so a killed build leaves no
half-written kit behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from areal_graph.data.reasoning_gym_teacher import BASIC_ARITHMETIC as RG_BASIC_ARITHMETIC
from areal_graph.modelkit.reward_model import BUILTIN_REWARD_MODELS
from areal_graph.modelkit.shipped import install_shipped
from areal_graph.modelkit.tiny_model import TinyModelConfig
from areal_graph.modelkit.warm_start import SFTConfig

log = logging.getLogger(__name__)

PREFIX = "builtin:"
# Bump when the build code changes in a way the recipe fields do not capture. 2: the lean SFT
# forward (engines/training/lean_train.py), lessons, `sft_seed`. 3: fused AdamW.
KIT_FORMAT = 3

# tiny-arith's model: narrow, with 8 heads. Copying the k-th operand of the question into
# line k of the solution is what SFT learns slowest; with 4 heads of 48 dims (the shape of
# tiny-arith-long) it was still learning it after 800 steps, with 8 heads of 16 it had it
# within ~400 (the calculator kit found the same for copying numbers into a call).
TINY_ARITH_MODEL = TinyModelConfig(hidden_size=128, intermediate_size=384, num_heads=8, num_kv_heads=4)


@dataclass(frozen=True)
class KitConfig:
    """Everything that shapes a kit; its hash names the cache directory. The defaults are
    builtin:tiny-arith."""

    name: str = "tiny-arith"
    seed: int = 0  # the task data: which problems, which of them the teacher answers hastily
    # The warm start's training randomness (model init, every lesson's data order), apart
    # from the data: kits of several sft_seeds are the same task trained anew.
    sft_seed: int = 0
    difficulty: str = "one-digit"
    n_train: int = 20000
    n_test: int = 500
    vocab_size: int = 512
    model: TinyModelConfig = TINY_ARITH_MODEL
    # The SFT teacher answers this share of the training problems outright and hastily (one
    # operation short: data.arith.teacher_mixture) and works the rest out. Greedy decoding
    # inherits the habit, while sampled answers that work it out are right far more often:
    # the room RL has, and the habit it must unlearn from reward alone.
    hasty_rate: float = 0.7
    # The first lesson, SFT with a cosine-decayed lr. With `habit_sft` it shows only worked
    # solutions (the method); without, the hasty mixture (modelkit/kit_tasks.py, _arith_rows).
    # (Steps and batches sized for a build within 2 minutes on 2 AVX2 cores; Adam's step size
    # does not grow with the batch, so the habit lesson's strength is its steps x lr.)
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=450, batch_size=32))
    # The second lesson: the hasty mixture, briefly and at a tenth of the lr (None: one lesson).
    habit_sft: SFTConfig | None = field(
        default_factory=lambda: SFTConfig(steps=80, batch_size=32, lr=3e-4, warmup_steps=5))
    n_dev: int = 200  # generated problems held out of the training split (none of test either)
    eval_prompts: int = 500  # test prompts greedily decoded to record the warm-start accuracy
    eval_max_new_tokens: int = 64  # generation limit of that measurement (the longest answers must fit)
    # What the kit teaches (modelkit/kit_tasks.py): "arith" (data/arith.py, `difficulty` a level
    # there) or "calc" (data/calc.py: products with a calculator tool, `difficulty` a level there).
    task: str = "arith"
    # calc: the share of problems the SFT teacher answers without the calculator, per factor
    # size (data.calc.teacher_conversations); arith uses `hasty_rate` instead.
    direct_rates: tuple[float, ...] = ()

    def fingerprint(self) -> str:
        blob = json.dumps({"format": KIT_FORMAT, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# The long-tailed variant (the AReaL paper's regime): 1 to 20 steps of one-digit arithmetic,
# most problems 3-5 steps and about 15% of them 12 to 20 (data.arith "longtail"), so worked
# answers run from ~18 to ~170 tokens and hasty ones ~10: synchronous RL waits on each batch's
# longest answer, asynchronous RL keeps the engine's batch full. The same model shape, lessons
# and hasty teacher as tiny-arith (one recipe that learns, measured the same way); a context of
# 512 for prompts up to ~75 tokens plus the longest answers.
TINY_ARITH_LONG = KitConfig(
    name="tiny-arith-long",
    difficulty="longtail",
    model=dataclasses.replace(TINY_ARITH_MODEL, max_position_embeddings=512),
    sft=SFTConfig(steps=1000, batch_size=32, packed=True),
    habit_sft=SFTConfig(steps=80, lr=3e-4, warmup_steps=5, packed=True),
    eval_max_new_tokens=320,
)

# The tool-use variant: "What is 347 * 58?", factors of 2-3 digits, which the tiny model cannot
# multiply in its head but answers exactly with a calculator call (Hermes / Qwen2.5 tool format,
# api/tool_calls.py). Its teacher calls the calculator only some of the time, more often for
# bigger factors (direct_rates, per factor size 4/5/6 digits), and otherwise answers with a
# hasty estimate: greedy decoding calls it on few problems, so greedy accuracy starts low,
# while sampled answers call it often enough for RL to find that calling pays
# (workflows/agent_calculator.yaml). The model is narrower than tiny-arith's, with more heads
# (~0.8M parameters): copying numbers into the call and out of the result is what it must
# learn, and in SFT probes this shape learned it within the budget where wider four-head
# models were still before the jump; narrower also makes RL steps cheaper. Packed SFT: tool
# conversations are ~2.5x longer than outright answers.
TINY_CALC = KitConfig(
    name="tiny-calc",
    task="calc",
    difficulty="products",
    direct_rates=(0.9, 0.7, 0.4),
    model=TinyModelConfig(hidden_size=128, intermediate_size=384, num_heads=8, num_kv_heads=4),
    sft=SFTConfig(steps=800, packed=True),
    habit_sft=None,
    eval_max_new_tokens=48,  # per turn: a call is ~28 tokens, an answer ~12
)

# The game variant (data/guess_teacher.py): TextArena's GuessTheNumber-v0 (1 to 20, 10 guesses),
# with a BPE of the game's own text (its opening is ~120 tokens) and a context of 512 for a whole
# game. The teacher moves hastily (any number, hints ignored) on 70% of its moves and bisects on
# the rest: greedy play repeats itself, sampled play wins often enough to learn from
# (workflows/textarena_guess.yaml).
TINY_GUESS = KitConfig(
    name="tiny-guess",
    task="guess",
    difficulty="GuessTheNumber-v0",
    n_train=4000,
    n_test=256,
    vocab_size=1024,
    model=dataclasses.replace(TINY_ARITH_MODEL, max_position_embeddings=512),
    sft=SFTConfig(steps=400, batch_size=32, packed=True),
    habit_sft=None,
    eval_prompts=256,
    eval_max_new_tokens=8,  # per move: "[12]" and <|im_end|>
)

# reasoning-gym's basic_arithmetic as workflows/reasoning_gym_arith.yaml asks it (four phrasings,
# answers -18 to 27): tiny-arith's shape, lessons and hasty teacher on reasoning-gym's own
# problems (data/reasoning_gym_teacher.py), so that RL on the reasoning-gym task has room.
TINY_RG_ARITH = KitConfig(
    name="tiny-rg-arith",
    task="rg_arith",
    difficulty=RG_BASIC_ARITHMETIC,
)

BUILTIN_KITS: dict[str, KitConfig] = {"tiny-arith": KitConfig(), "tiny-arith-long": TINY_ARITH_LONG,
                                      "tiny-calc": TINY_CALC, "tiny-guess": TINY_GUESS,
                                      "tiny-rg-arith": TINY_RG_ARITH}
# dataset name -> (kit name, split)
BUILTIN_DATASETS: dict[str, tuple[str, str]] = {
    "arith/train": ("tiny-arith", "train"),
    "arith/test": ("tiny-arith", "test"),
    "arith-long/train": ("tiny-arith-long", "train"),
    "arith-long/test": ("tiny-arith-long", "test"),
    "calc/train": ("tiny-calc", "train"),
    "calc/test": ("tiny-calc", "test"),
    "guess/train": ("tiny-guess", "train"),
    "guess/test": ("tiny-guess", "test"),
}


@dataclass(frozen=True)
class Kit:
    """A built kit on disk."""

    path: Path
    info: dict

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def data_path(self, split: str) -> Path:
        return self.path / "data" / f"{split}.jsonl"


def cache_root() -> Path:
    """`$AREAL_GRAPH_CACHE`, else `~/.cache/areal-graph`."""
    env = os.environ.get("AREAL_GRAPH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "areal-graph"


def kit_dir(cfg: KitConfig, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{cfg.name}-{cfg.fingerprint()}"


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_kit(cfg: KitConfig, root: Path | None = None) -> Kit | None:
    """The built kit for `cfg`, or None when it is not (completely) built."""
    path = kit_dir(cfg, root)
    info_path = path / "kit.json"
    if not info_path.exists():
        return None
    return Kit(path, json.loads(info_path.read_text()))


Progress = Callable[[str], None]


def ensure_kit(cfg: KitConfig, root: Path | None = None, progress: Progress | None = None,
               rebuild: bool = False, from_recipe: bool = False) -> Kit:
    """The kit for `cfg`, made first if needed (once, even across processes): installed from
    the warm start shipped with the package when one of this recipe is (modelkit/shipped.py),
    else built from the recipe. `rebuild` replaces a cached kit; `from_recipe` builds from the
    recipe even where a shipped warm start exists."""
    path = kit_dir(cfg, root)
    if not rebuild and (kit := load_kit(cfg, root)) is not None:
        return kit
    with _exclusive(path.with_name(path.name + ".lock")):
        if not rebuild and (kit := load_kit(cfg, root)) is not None:
            return kit  # another process built it while we waited
        log.info("building the %s kit into %s (first use; later runs reuse it)", cfg.name, path)
        # A build killed before its cleanup ran leaves its temporary dir; we hold the lock, so
        # no other build is running and every leftover is garbage.
        for stale in path.parent.glob(path.name + ".building*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = path.with_name(path.name + f".building{os.getpid()}")
        say = progress or (lambda msg: log.info("%s", msg))
        try:
            info = None if from_recipe else install_shipped(cfg, tmp, say)
            if info is None:
                info = build_kit(cfg, tmp, say)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Kit(path, info)


def build_kit(cfg: KitConfig, out: Path, progress: Progress) -> dict:
    """Build every part of the kit into `out`; returns what goes into kit.json."""
    import torch

    from areal_graph.data.arith import write_jsonl
    from areal_graph.modelkit.kit_tasks import kit_task
    from areal_graph.modelkit.tiny_model import build_tiny_model, count_parameters, save_model_and_tokenizer
    from areal_graph.modelkit.tokenizer import train_tokenizer
    from areal_graph.modelkit.warm_start import sft

    task = kit_task(cfg.task)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    threads = torch.get_num_threads()

    progress(task.describe(cfg))
    train, test, lessons = task.rows(cfg)
    write_jsonl(train, out / "data" / "train.jsonl")
    write_jsonl(test, out / "data" / "test.jsonl")
    timings["data_s"] = time.perf_counter() - t0

    progress(f"tokenizer: byte-level BPE, vocab {cfg.vocab_size}")
    t = time.perf_counter()
    tokenizer = train_tokenizer(task.tokenizer_texts(train, [r for lesson in lessons for r in lesson.rows]),
                                cfg.vocab_size, tools=task.tools)
    timings["tokenizer_s"] = time.perf_counter() - t

    torch.manual_seed(cfg.sft_seed)
    model = build_tiny_model(tokenizer, cfg.model, seed=cfg.sft_seed)
    n_params = count_parameters(model)
    total_steps = sum(lesson.sft.steps for lesson in lessons)
    progress(f"warm start: SFT of a {n_params / 1e6:.2f}M-parameter Qwen2, {total_steps} steps"
             + (f" in {len(lessons)} lessons ({', '.join(f'{x.name} {x.sft.steps}' for x in lessons)})"
                if len(lessons) > 1 else ""))
    t = time.perf_counter()
    losses: list[float] = []
    lesson_info = []
    for lesson in lessons:
        done = len(losses)

        def on_step(step: int, loss: float, done: int = done, name: str = lesson.name) -> None:
            if (done + step + 1) % 50 == 0:
                progress(f"sft step {done + step + 1} ({name}) loss {loss:.3f}")

        sft_cfg = dataclasses.replace(lesson.sft, seed=lesson.sft.seed + cfg.sft_seed)
        lesson_losses = sft(model, tokenizer, lesson.rows, sft_cfg, on_step=on_step, encode=task.encode)
        losses += lesson_losses
        lesson_info.append({"name": lesson.name, "steps": len(lesson_losses), "final_loss": lesson_losses[-1]})
    timings["sft_s"] = time.perf_counter() - t
    save_model_and_tokenizer(model, tokenizer, out / "model")

    progress(f"measuring warm-start greedy accuracy on {min(cfg.eval_prompts, len(test))} test problems")
    t = time.perf_counter()
    result = task.evaluate(out / "model", out / "data" / "test.jsonl", cfg)
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    info = {
        "name": cfg.name,
        "source": "recipe",
        "fingerprint": cfg.fingerprint(),
        "recipe": dataclasses.asdict(cfg),
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "sft_steps": len(losses),
        "sft_final_loss": losses[-1],
        "sft_lessons": lesson_info,
        "warm_start_greedy_accuracy": result["greedy_accuracy"],
        **({"warm_start_greedy_tool_call_rate": result["greedy_tool_call_rate"]}
           if "greedy_tool_call_rate" in result else {}),
        "eval_prompts": result["prompts"],
        "eval_max_new_tokens": cfg.eval_max_new_tokens,
        "torch_threads": threads,
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "built_on": machine_description(threads),
    }
    (out / "kit.json").write_text(json.dumps(info, indent=2) + "\n")
    progress(f"done in {timings['total_s']:.0f} s: greedy accuracy {result['greedy_accuracy']:.1%}")
    return info


def machine_description(threads: int) -> str:
    """What a build's floats depend on: the CPU, torch and its thread count."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), {threads} thread(s)"


def _builtin_name(spec: str, known: dict, what: str) -> str | None:
    """The entry name of a `builtin:` spec (ValueError naming the builtins if there is no such
    entry); None for any other path."""
    if not str(spec).startswith(PREFIX):
        return None
    name = str(spec)[len(PREFIX):]
    if name not in known and not (what == "dataset" and name in SHIPPED_DATASETS):
        names = [PREFIX + n for n in (*known, *(SHIPPED_DATASETS if what == "dataset" else ()))]
        near = difflib.get_close_matches(str(spec), names, n=1)
        raise ValueError(f"unknown builtin {what} {spec!r}; builtin {what}s: " + ", ".join(names)
                         + (f" (did you mean {near[0]}?)" if near else ""))
    return name


def path_fields(spec: Any) -> list[tuple[str, str, str]]:
    """(field, path, "model" or "dataset") for every model and dataset path `spec` (a
    WorkflowSpec) names."""
    fields = [(f"models.{m.name}.path", str(m.path), "model") for m in spec.models.values()]
    return fields + [(f"data.{k}", str(v), "dataset") for k, v in (("train", spec.data.train),
                                                                  ("eval", spec.data.eval)) if v]


def builtin_path_problems(spec: Any) -> list[str]:
    """Every `builtin:` model or dataset path of `spec` (a WorkflowSpec) that names no builtin,
    with its field (and the nearest name), without building anything: a run checks this before
    it makes its folder."""
    known: dict[str, dict[str, Any]] = {"model": {**BUILTIN_KITS, **BUILTIN_REWARD_MODELS}, "dataset": BUILTIN_DATASETS}
    problems = []
    for field, path, what in path_fields(spec):
        try:
            _builtin_name(path, known[what], what)
        except ValueError as err:
            problems.append(f"{field}: {err}")
    return problems


def model_head_dim(path: str) -> int | None:
    """The attention head width of the model at `path` (a `builtin:` kit, whose recipe says it
    without building it, or a directory with config.json); None when it cannot be read."""
    if str(path).startswith(PREFIX):
        kit = BUILTIN_KITS.get(str(path)[len(PREFIX):])
        return kit.model.hidden_size // kit.model.num_heads if kit is not None else None
    try:
        config = json.loads((Path(path) / "config.json").read_text())
        return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _builtin_kit(spec: str, known: dict, what: str, progress: Progress | None) -> tuple[Kit, str] | None:
    """(built kit, entry name) for a `builtin:` spec; None for any other path."""
    name = _builtin_name(spec, known, what)
    if name is None:
        return None
    kit_name = known[name][0] if what == "dataset" else name
    return ensure_kit(BUILTIN_KITS[kit_name], progress=progress), name


def resolve_model_path(path: str, progress: Progress | None = None) -> Path:
    """`builtin:tiny-arith` -> the kit's model directory (built on first use); `builtin:tiny-arith-rm`
    -> the reward model's (modelkit/reward_model.py); any other path unchanged."""
    name = _builtin_name(path, {**BUILTIN_KITS, **BUILTIN_REWARD_MODELS}, "model")
    if name in BUILTIN_REWARD_MODELS:
        from areal_graph.modelkit.reward_model import ensure_reward_model

        return ensure_reward_model(BUILTIN_REWARD_MODELS[name], progress=progress)
    found = _builtin_kit(path, BUILTIN_KITS, "model", progress)
    return Path(path) if found is None else found[0].model_dir


# Small datasets shipped as files in the package (no kit to build): `builtin:<name>`.
SHIPPED_DATASETS: dict[str, str] = {
    "code-demo": "code_demo.jsonl",  # 20 programming problems with tests (workflows/code_reward_demo.yaml)
}


def resolve_dataset_path(spec: str, progress: Progress | None = None) -> Path:
    """`builtin:arith/train` -> the kit's JSONL file (built on first use); `builtin:code-demo` ->
    the file shipped in the package; `reasoning_gym:<task>?...`, `textarena:<game>?...` -> their rows,
    generated into the kit cache on first use (data/generated.py); any other path unchanged."""
    from areal_graph.data import generated

    if generated.source_of(spec) is not None:  # generated once into the kit cache, then an ordinary file
        return generated.materialize(str(spec), cache_root())
    name = str(spec)[len(PREFIX):] if str(spec).startswith(PREFIX) else None
    if name in SHIPPED_DATASETS:
        import areal_graph.data

        return Path(areal_graph.data.__file__).parent / SHIPPED_DATASETS[name]
    found = _builtin_kit(spec, BUILTIN_DATASETS, "dataset", progress)
    return Path(spec) if found is None else found[0].data_path(BUILTIN_DATASETS[found[1]][1])


def resolve_builtin_paths(spec: Any, progress: Progress | None = None) -> Any:
    """`spec` (a WorkflowSpec) with every `builtin:` model and dataset path replaced by the
    local path of its kit, building kits on first use. The one place builtin paths resolve:
    everything after it (executor, workers, servers) sees ordinary directories and files."""
    import dataclasses

    models = {name: dataclasses.replace(m, path=str(resolve_model_path(m.path, progress)))
              for name, m in spec.models.items()}
    data = dataclasses.replace(spec.data, train=str(resolve_dataset_path(spec.data.train, progress)),
                               eval=str(resolve_dataset_path(spec.data.eval, progress)) if spec.data.eval else None)
    return dataclasses.replace(spec, models=models, data=data)
