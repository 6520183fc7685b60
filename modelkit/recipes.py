"""The builtin model kits' recipes, and how a recipe is built into a kit.

`builtin:tiny-arith` with `builtin:arith/{train,test}` (2-3 step arithmetic),
`builtin:tiny-arith-long` with `builtin:arith-long/{train,test}` (1 to 20 steps, long-tailed
answer lengths: the regime where asynchronous RL pays most), `builtin:tiny-calc` with
`builtin:calc/{train,test}` (products answered with a calculator tool: multi-turn tool use),
`builtin:tiny-guess` (a TextArena game), `builtin:tiny-games` (five single-player TextArena
games), `builtin:tiny-tictactoe` (TicTacToe from both seats, for self-play) and
`builtin:tiny-rg-arith` (reasoning-gym arithmetic).

Nothing may be downloaded, yet a new user's first `areal-graph run` needs a model that solves
the task *some* of the time. So a kit is built offline and deterministically (`build_kit`): a
synthetic dataset, a byte-level BPE tokenizer trained on it, a tiny Qwen2 model, and a short
SFT warm start. Where the kit lives, and building it once even across processes, is
modelkit/kit_cache.py; resolving `builtin:` names is modelkit/builtin.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from areal_graph.data.arith import write_jsonl
from areal_graph.data.reasoning_gym_teacher import BASIC_ARITHMETIC as RG_BASIC_ARITHMETIC
from areal_graph.modelkit.kit_tasks import kit_task
from areal_graph.modelkit.tiny_model import (
    TinyModelConfig,
    build_tiny_model,
    count_parameters,
    save_model_and_tokenizer,
)
from areal_graph.modelkit.tokenizer import train_tokenizer
from areal_graph.modelkit.warm_start import SFTConfig, sft

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
        default_factory=lambda: SFTConfig(steps=80, batch_size=32, lr=3e-4, warmup_steps=5)
    )
    n_dev: int = 200  # generated problems held out of the training split (none of test either)
    eval_prompts: int = 500  # test prompts greedily decoded to record the warm-start accuracy
    eval_max_new_tokens: int = 64  # generation limit of that measurement (the longest answers must fit)
    # What the kit teaches (modelkit/kit_tasks.py): "arith" (data/arith.py, `difficulty` a level
    # there) or "calc" (data/calc.py: products with a calculator tool, `difficulty` a level there).
    task: str = "arith"
    # calc: the share of problems the SFT teacher answers without the calculator, per factor
    # size (data.calc.teacher_conversations); arith uses `hasty_rate` instead.
    direct_rates: tuple[float, ...] = ()
    # arith: the share of problems of s steps the SFT teacher works out, per s (the last for
    # longer ones; data.arith.ladder_teacher); empty: `hasty_rate` for every problem.
    # tictactoe: (careful,) or (careful, random): the shares of moves played perfectly and at a
    # random free cell, the habit on the rest.
    worked_rates: tuple[float, ...] = ()
    # tictactoe: the teacher's hasty move, "first_free" or "last_free" (the first or the last free
    # cell in reading order: data/tictactoe_teacher.py says why the kit uses the last); the other
    # tasks have one habit each and leave it empty.
    habit: str = ""

    def recipe(self) -> dict:
        """The recipe as kit.json records it. A field added later is left out while at its no-op
        default (worked_rates (), habit ""), so the kits shipped before it keep their recipe and
        fingerprint."""
        fields = dataclasses.asdict(self)
        for name in ("worked_rates", "habit"):
            if not fields[name]:
                del fields[name]
        return fields

    def fingerprint(self) -> str:
        blob = json.dumps({"format": KIT_FORMAT, **self.recipe()}, sort_keys=True)
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

# The testbed (issue 36, prototype): a ladder of 1-12 step problems whose teacher works out the
# short ones and ever fewer long ones, so greedy accuracy starts low and RL climbs rung by rung
# with answers growing longer, instead of unlearning one habit in 25 steps.
TINY_ARITH_LADDER = KitConfig(
    name="tiny-arith-ladder",
    difficulty="ladder",
    model=dataclasses.replace(TINY_ARITH_MODEL, max_position_embeddings=512),
    worked_rates=(1.0, 1.0, 0.6, 0.35, 0.2, 0.12, 0.07, 0.04, 0.025, 0.015, 0.01, 0.006),
    sft=SFTConfig(steps=1000, batch_size=32, packed=True),
    habit_sft=SFTConfig(steps=80, lr=3e-4, warmup_steps=5, packed=True),
    eval_max_new_tokens=160,
)

# Several single-player TextArena games in one kit (data/game_teachers.py): TowerOfHanoi-v0 (RL
# learns it: workflows/textarena_hanoi.yaml), Cryptarithm-v0 and FrozenLake-v0 (played, not
# learned: the warm start does not play Cryptarithm's move order reliably, and its sampled
# FrozenLake play keeps to the habit: docs/agents.md), GuessTheNumber-v0 and Blackjack-v0 (five
# hands; the habit hits whatever the score: workflows/textarena_blackjack.yaml), with a BPE of their
# text and a context of 1024 for a whole game (FrozenLake redraws its board every move: a 6-move
# game is ~700 tokens). The teachers are careful (a solver) on worked_rates of their moves, per
# game, and follow a habit on the rest: greedy play wins no Hanoi game (sampled: ~6%).
TINY_GAMES = KitConfig(
    name="tiny-games",
    task="games",
    difficulty="TowerOfHanoi-v0,FrozenLake-v0,GuessTheNumber-v0,Cryptarithm-v0,Blackjack-v0",
    worked_rates=(0.4, 0.3, 0.3, 0.3, 0.4),
    n_train=4000,
    n_test=192,
    vocab_size=1024,
    model=dataclasses.replace(TINY_ARITH_MODEL, max_position_embeddings=1024),
    # 800 steps (450 left Cryptarithm's seventh move wrong: "[O 9]" for "[S 9]" in 28 of 32 sampled games)
    sft=SFTConfig(steps=800, batch_size=16, packed=True),
    habit_sft=None,
    eval_prompts=192,
    eval_max_new_tokens=8,  # per move: "[A C]", "[down]", "[12]", "[S 9]", "[Stand]" and <|im_end|>
)

# TicTacToe-v0 for two seats (data/tictactoe_teacher.py): the teacher plays perfectly (minimax) on
# 30% of its moves and a random free cell on the rest, half its games against itself (both seats
# learned from), half against random moves. The warm start is meant to be played under the
# legal-move mask (the workflow's `mask_illegal_moves: true`): it has learned where every free
# cell goes, not one habit, so it leaves self-play room both ways. Masked and greedy it wins 69% of
# its games against random moves as seat 0 and 38% as seat 1 and draws 41% of them against the
# heuristic as seat 0 (docs/agents.md has what self-play does with it, and the kits tried before).
# The two rates add up to 1, so the habit (last free cell) plays no move; it stays in the recipe.
TINY_TICTACTOE = KitConfig(
    name="tiny-tictactoe",
    task="tictactoe",
    difficulty="TicTacToe-v0",
    worked_rates=(0.3, 0.7),
    habit="last_free",
    n_train=2000,
    n_test=128,
    vocab_size=1024,
    # a seat's game is 420-750 tokens as the teacher plays it; refused moves (the game repeats the
    # board after each) make a sampled one longer, and a game cut at the context ends unfinished
    model=dataclasses.replace(TINY_ARITH_MODEL, max_position_embeddings=1536),
    sft=SFTConfig(steps=300, batch_size=16, packed=True),
    habit_sft=None,
    eval_prompts=128,
    eval_max_new_tokens=8,  # per move: "[4]" and <|im_end|>
)

BUILTIN_KITS: dict[str, KitConfig] = {
    "tiny-arith": KitConfig(),
    "tiny-arith-long": TINY_ARITH_LONG,
    "tiny-arith-ladder": TINY_ARITH_LADDER,
    "tiny-calc": TINY_CALC,
    "tiny-guess": TINY_GUESS,
    "tiny-games": TINY_GAMES,
    "tiny-tictactoe": TINY_TICTACTOE,
    "tiny-rg-arith": TINY_RG_ARITH,
}
# dataset name -> (kit name, split)
BUILTIN_DATASETS: dict[str, tuple[str, str]] = {
    "arith/train": ("tiny-arith", "train"),
    "arith/test": ("tiny-arith", "test"),
    "arith-long/train": ("tiny-arith-long", "train"),
    "arith-long/test": ("tiny-arith-long", "test"),
    "arith-ladder/train": ("tiny-arith-ladder", "train"),
    "arith-ladder/test": ("tiny-arith-ladder", "test"),
    "calc/train": ("tiny-calc", "train"),
    "calc/test": ("tiny-calc", "test"),
    "guess/train": ("tiny-guess", "train"),
    "guess/test": ("tiny-guess", "test"),
    "games/train": ("tiny-games", "train"),
    "games/test": ("tiny-games", "test"),
    "tictactoe/train": ("tiny-tictactoe", "train"),
    "tictactoe/test": ("tiny-tictactoe", "test"),
}


# Small datasets shipped as files in the package (no kit to build): `builtin:<name>`.
SHIPPED_DATASETS: dict[str, str] = {
    "code-demo": "code_demo.jsonl",  # 20 programming problems with tests (workflows/code_reward_demo.yaml)
}

Progress = Callable[[str], None]


def build_kit(cfg: KitConfig, out: Path, progress: Progress) -> dict:
    """Build every part of the kit into `out`; returns what goes into kit.json."""
    import torch

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
    tokenizer = train_tokenizer(
        task.tokenizer_texts(train, [r for lesson in lessons for r in lesson.rows]), cfg.vocab_size, tools=task.tools
    )
    timings["tokenizer_s"] = time.perf_counter() - t

    torch.manual_seed(cfg.sft_seed)
    model = build_tiny_model(tokenizer, cfg.model, seed=cfg.sft_seed)
    n_params = count_parameters(model)
    total_steps = sum(lesson.sft.steps for lesson in lessons)
    progress(
        f"warm start: SFT of a {n_params / 1e6:.2f}M-parameter Qwen2, {total_steps} steps"
        + (
            f" in {len(lessons)} lessons ({', '.join(f'{x.name} {x.sft.steps}' for x in lessons)})"
            if len(lessons) > 1
            else ""
        )
    )
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
        "recipe": cfg.recipe(),
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "sft_steps": len(losses),
        "sft_final_loss": losses[-1],
        "sft_lessons": lesson_info,
        "warm_start_greedy_accuracy": result["greedy_accuracy"],
        **(
            {"warm_start_greedy_tool_call_rate": result["greedy_tool_call_rate"]}
            if "greedy_tool_call_rate" in result
            else {}
        ),
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
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), {threads} thread(s)"
