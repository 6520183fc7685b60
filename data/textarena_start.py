"""Why a TextArena game does not start here, named as what it is.

Why a module of its own: TextArena's ENV_REGISTRY lists ~240 games, and of those that take one
player many still fail at `reset` for reasons unrelated to player count: a word list NLTK
downloads at import (offline: a LookupError), a second player played by an LLM behind an API
key, an optional package, or a bug inside textarena itself. Reporting all of these as "not
single-player" sent users to the docs' own examples that cannot start. Here each failure is
classified from its exception (type, message, traceback) into a reason with what to do about it,
and the first reset runs under a time limit so a download that stalls (nltk waits up to 120 s per
read) fails in seconds instead of hanging a run.

`PLAYABLE_GAMES` is the static list the messages recommend: single-player games that start with
textarena alone (no data download, no key, no extra package), each reset by
tests/data/test_textarena_start.py. benchmarks/bench_textarena_games.py tries every game and
writes the table in docs/agents.md.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Seconds a game's first reset may take here. Every game that starts does so within ~2 s on
# 2 cores (benchmarks/bench_textarena_games.py); the limit is what a stalled download costs.
START_TIMEOUT_S = 30.0

# Single-player games that start with textarena 0.7.4 alone, on a machine without network: what
# the did-you-mean and the examples of check messages name (verified by resetting each one).
PLAYABLE_GAMES: tuple[str, ...] = (
    "GuessTheNumber-v0",
    "TowerOfHanoi-v0",
    "FrozenLake-v0",
    "Minesweeper-v0-small",
    "Sudoku-v0-very-easy",
    "Countdown-v0",
    "Slitherlink-v0",
    "Mastermind-v0",
    "LightsOut-v0",
    "FifteenPuzzle-v0",
    "Sokoban-v0",
    "RushHour-v0",
    "PegJump-v0",
    "Bandit-v0",
    "Blackjack-v0",
    "2048-v0-super-easy",
    "Cryptarithm-v0",
    "Secretary-v0",
    "ThreeCardMonte-v0",
    "LogicPuzzle-v0",
)

# Import names whose pip package is named otherwise, or that pip cannot install by name.
PIP_NAMES = {
    "gym": "gym",
    "cv2": "opencv-python",
    "babyai_text": "babyai_text (from https://github.com/flowersteam/Grounding_LLMs_with_online_RL/tree/main/babyai-text)",
}

KINDS = ("multi-player", "package", "data", "api-key", "network", "library-bug", "timeout", "error")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SITE_PACKAGES = re.compile(r"\S*[/\\]site-packages[/\\]")  # an install's path prefix, left out of messages


@dataclass(frozen=True)
class StartFailure:
    """Why a game did not start: `kind` one of KINDS, `detail` what it needs or where it broke
    (no game name, so a caller can put the name first), `short` the same in a few words (the docs
    table of benchmarks/bench_textarena_games.py)."""

    kind: str
    detail: str
    short: str = ""


def playable_hint() -> str:
    """The tail of a message that recommends games: only ones that start here."""
    return "single-player games that start here include " + ", ".join(PLAYABLE_GAMES[:6])


def try_start(start: Callable[[], Any], timeout_s: float = START_TIMEOUT_S, players: int = 1) -> StartFailure | None:
    """Run `start()` (a game's make and first reset; it returns the game) with at most `timeout_s`
    seconds; None when it returned a game of `players` seats, else why not. It runs in a daemon thread so
    a stalled download cannot hang the caller (the thread is left to its own network timeout); what
    a game prints to stdout meanwhile is dropped (the reason is said once, here). nltk's own lines
    about a failed download go to the stderr it bound at import, and still show."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["game"] = start()
            outcome["error"] = None
        except BaseException as err:  # noqa: BLE001 - every failure is classified below
            outcome["error"] = err

    printed = io.StringIO()
    worker = threading.Thread(target=target, name="textarena-start", daemon=True)
    with contextlib.redirect_stdout(printed):
        worker.start()
        worker.join(timeout_s)
        stack = sys._current_frames().get(worker.ident or -1) if worker.is_alive() else None
    if stack is not None:
        return stalled(traceback.extract_stack(stack), timeout_s)
    err = outcome.get("error")
    if err is not None:
        return classify(err)
    seats = getattr(getattr(outcome.get("game"), "state", None), "num_players", players)
    if isinstance(seats, int) and seats != players:  # a game that ignores the count it is given
        return StartFailure(
            "multi-player",
            f"it is a game for {seats} players (it sets up {seats} when given {players})",
            f"{seats} players",
        )
    return None


def stalled(stack: traceback.StackSummary, timeout_s: float) -> StartFailure:
    """A start still running after `timeout_s`: where it is waiting says why."""
    files = [frame.filename.replace("\\", "/") for frame in stack]
    if any("/nltk/" in f for f in files):
        resources = nltk_downloads(stack) or ["words"]
        return StartFailure(
            "data",
            f"it was still downloading the NLTK data {', '.join(map(repr, resources))} after {timeout_s:.0f} s "
            "(the network does not answer here); " + NLTK_HOW.format(resource=" ".join(resources)),
            "NLTK data " + ", ".join(f"`{r}`" for r in resources) + " (download stalled)",
        )
    if any(re.search(r"/(socket|ssl|http/client|urllib/request|requests|httpx|openai)", f) for f in files):
        return StartFailure("network", f"it was still waiting on the network after {timeout_s:.0f} s", "network")
    return StartFailure(
        "timeout", f"its first reset did not finish within {timeout_s:.0f} s (at {where(stack)})", "slow start"
    )


NLTK_HOW = (
    "on a machine with network run `python -m nltk.downloader {resource}` and copy ~/nltk_data here "
    "(or point NLTK_DATA at a copy)"
)


def chain(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions it was raised from or while handling, outermost first."""
    seen: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def where(stack: traceback.StackSummary | list[traceback.FrameSummary]) -> str:
    """`textarena/envs/X/env.py:NN`: the innermost frame inside textarena (else the innermost)."""
    frames = list(stack)
    inside = [f for f in frames if "/textarena/" in f.filename.replace("\\", "/")]
    if not (inside or frames):
        return "an unknown place"
    frame = (inside or frames)[-1]
    return f"{short_path(frame.filename)}:{frame.lineno}"


def short_path(filename: str) -> str:
    """A library file from its package folder on (`textarena/envs/Klondike/env.py`)."""
    parts = Path(filename).parts
    for root in ("textarena", "nltk"):
        if root in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(root) - 1 :])
    return filename


NUMBER_WORDS = {"two": "2", "three": "3", "four": "4", "five": "5", "six": "6"}


def players_needed(message: str) -> str | None:
    """ "2", "2 to 15", "an even number of" from textarena's player-count refusals (each game words
    its own: "has to be 2", "2 ≤ players ≤ 15", "a two-player game only", "exactly four players",
    "must be even"); None for any other message."""
    text = message.lower()
    for word, digit in NUMBER_WORDS.items():
        text = re.sub(rf"\b{word}\b", digit, text)
    if "player" not in text:
        return None
    for pattern, form in (
        (r"players? (?:has|have) to be (\d+)\b", "{0}"),
        (r"(\d+)\s*(?:≤|<=)\s*players\s*(?:≤|<=)\s*(\d+)", "{0} to {1}"),
        (r"between (\d+) and (\d+)", "{0} to {1}"),
        (r"at least (\d+)", "at least {0}"),
        (r"(\d+)-player game", "{0}"),
        (r"exactly (\d+) players", "{0}"),
        (r"players must be even", "an even number of"),
    ):
        m = re.search(pattern, text)
        if m and m.groups() != ("1",):
            return form.format(*m.groups())
    # "supports 2, 3, or 4 players", "supports 2-4 players", "must be 2 or 3": the counts it names
    counts = sorted({int(n) for n in re.findall(r"\d+", re.sub(r"received \d+", "", text)) if int(n) >= 2})
    if not counts:
        return None
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def nltk_downloads(frames: traceback.StackSummary) -> list[str]:
    """The NLTK resources the failing game's own code downloads (`nltk.download(...)` in the .py
    files of its folder under textarena/envs), so one message names them all, not only the first."""
    folders = {Path(f.filename).parent for f in frames if "/textarena/envs/" in f.filename.replace("\\", "/")}
    found: list[str] = []
    for folder in sorted(folders):
        for source in sorted(folder.glob("*.py")):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                for call in re.findall(r"nltk\.download\(([^)]*)\)", source.read_text()):
                    found += re.findall(r"['\"]([\w./-]+)['\"]", call.split("quiet")[0])
    return list(dict.fromkeys(found))


def classify(err: BaseException) -> StartFailure:
    """What `err`, raised by a game's make or first reset, says the game needs."""
    errors = chain(err)
    message = ANSI.sub("", " ".join(str(e) for e in errors))
    frames = traceback.extract_tb(err.__traceback__)
    for e in errors:
        if isinstance(e, SyntaxError):
            at = f"{short_path(e.filename or '?')}:{e.lineno}"
            return StartFailure(
                "library-bug",
                f"textarena's own code does not compile (SyntaxError at {at}: {e.msg}), a bug in the library",
                f"SyntaxError at `{at}`",
            )
    needed = players_needed(message)
    if needed is not None and isinstance(err, (AssertionError, ValueError)):
        return StartFailure("multi-player", f"it is a game for {needed} players (one was given)", f"{needed} players")
    module = next((e.name for e in errors if isinstance(e, ModuleNotFoundError) and e.name), None)
    module = module or next(iter(re.findall(r"No module named '([\w.]+)'", message)), None)
    if module is not None and module.split(".")[0] == "textarena":
        return StartFailure(
            "library-bug",
            f"its registry entry names a module textarena does not have ({module}), a bug in the library",
            f"no module `{module}`",
        )
    if module is not None or any(isinstance(e, ImportError) for e in errors):
        top = (module or "?").split(".")[0]
        pip = PIP_NAMES.get(top, top)
        how = f"pip install {pip}" if " " not in pip else f"install {pip}"
        return StartFailure(
            "package", f"it needs the Python package {top!r}, which is not installed: {how}", f"`{how}`"
        )
    if isinstance(err, LookupError) and ("nltk" in message.lower() or "Resource" in message):
        found = re.findall(r"Resource\s+'?([\w./-]+?)'?\s+not found", message)
        resources = list(dict.fromkeys([*found, *nltk_downloads(frames)])) or ["words"]
        names = ", ".join(map(repr, resources))
        return StartFailure(
            "data",
            f"it needs the NLTK data {names}: not on this machine, and it cannot be downloaded here; "
            + NLTK_HOW.format(resource=" ".join(resources)),
            "NLTK data " + ", ".join(f"`{r}`" for r in resources),
        )
    key = re.search(r"\b([A-Z][A-Z0-9_]*_(?:API_)?KEY)\b", message)
    if key is None and isinstance(err, KeyError) and str(err.args[0] if err.args else "").endswith("KEY"):
        key = re.match(r"(.*)", str(err.args[0]))
    if key is not None or "api key" in message.lower():
        var = key.group(1) if key else "an API key variable"
        return StartFailure(
            "api-key",
            f"it needs an API key: its other side is played by an LLM through a web API (set {var}; the machine needs network too)",
            f"`{var}` (an LLM plays the other side)",
        )
    if any(
        isinstance(e, (ConnectionError, TimeoutError)) or type(e).__name__ in ("URLError", "gaierror") for e in errors
    ):
        return StartFailure("network", f"it reaches the network at start ({type(err).__name__}: {err})", "network")
    text = SITE_PACKAGES.sub("", ANSI.sub("", str(err)))[:200]
    if any("/textarena/" in f.filename.replace("\\", "/") for f in frames):
        return StartFailure(
            "library-bug",
            f"it fails inside textarena ({type(err).__name__} at {where(frames)}: {text}), a bug in the library",
            f"{type(err).__name__} at `{where(frames)}`"
            + (
                f" (`{short_path(err.filename)}` missing)"
                if isinstance(err, FileNotFoundError) and err.filename
                else ""
            ),
        )
    return StartFailure("error", f"it fails at start ({type(err).__name__}: {text})", type(err).__name__)


def describe(env: str, failure: StartFailure) -> str:
    """The one-line message for game `env` that did not start."""
    lead = {
        "multi-player": f"textarena game {env!r} is not single-player: {failure.detail}",
        "package": f"textarena game {env!r} cannot start here: {failure.detail}",
        "data": f"textarena game {env!r} cannot start here: {failure.detail}",
        "api-key": f"textarena game {env!r} cannot start here: {failure.detail}",
        "network": f"textarena game {env!r} cannot start here: {failure.detail}",
        "library-bug": f"textarena game {env!r} is broken in this textarena version: {failure.detail}",
        "timeout": f"textarena game {env!r} did not start: {failure.detail}",
    }.get(failure.kind, f"textarena game {env!r} does not start: {failure.detail}")
    from areal_graph.data.two_player_games import TWO_PLAYER_GAMES

    if failure.kind == "multi-player" and env in TWO_PLAYER_GAMES:
        return (
            f"{lead}; to play both seats (self-play), add &players=2 to the spec and use rollout_class "
            "areal_graph.workflows.rollout.textarena_selfplay:TextArenaSelfPlay (workflows/textarena_selfplay.yaml)"
        )
    return f"{lead}; {playable_hint()}"
