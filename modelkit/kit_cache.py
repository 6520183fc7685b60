"""Where built kits live, and making one exactly once, even across processes.

Layout of one kit (`<cache>/<name>-<fingerprint>/`, e.g. `tiny-arith-43a2521c751c/`):

    model/        save_pretrained model + tokenizer (loads with AutoModelForCausalLM/AutoTokenizer)
    data/         train.jsonl, test.jsonl  ({"question", "answer", "solution"})
    kit.json      the recipe, sizes, build time and warm-start accuracy

The cache directory is named after a fingerprint of everything that shapes the kit
(`KitConfig.fingerprint`, modelkit/recipes.py), so a second resolve is instant and a changed
recipe never reuses a stale build. Several processes of one run may resolve the same name at
once (controller, servers, workers): an exclusive file lock makes exactly one of them build;
the others wait and reuse. A build goes to a temporary directory renamed into place, so a
killed build leaves no half-written kit behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from areal_graph.modelkit.kit_notice import build_notice, wait_notice
from areal_graph.modelkit.recipes import KitConfig, Progress, build_kit
from areal_graph.modelkit.shipped import install_shipped

log = logging.getLogger(__name__)


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
def exclusive(lock_path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the exclusive lock `lock_path`; `on_wait` is called first when another process holds it
    (so a caller can say why it stands still) and then this waits for it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
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


def ensure_kit(
    cfg: KitConfig,
    root: Path | None = None,
    progress: Progress | None = None,
    rebuild: bool = False,
    from_recipe: bool = False,
) -> Kit:
    """The kit for `cfg`, made first if needed (once, even across processes): installed from
    the warm start shipped with the package when one of this recipe is (modelkit/shipped.py),
    else built from the recipe. `rebuild` replaces a cached kit; `from_recipe` builds from the
    recipe even where a shipped warm start exists. A build from the recipe takes minutes, so it is
    announced first (which kit, why, about how long, where: modelkit/kit_notice.py), and so is
    waiting for another process's build; a cached kit and a shipped install say nothing extra."""
    path = kit_dir(cfg, root)
    if not rebuild and (kit := load_kit(cfg, root)) is not None:
        return kit
    say = progress or (lambda msg: log.info("%s", msg))
    # What the user must see before minutes pass: through `progress` (the CLI's console) or, with
    # none, a warning (the level the CLI's logging shows by default).
    tell = progress or (lambda msg: log.warning("%s", msg))
    with exclusive(path.with_name(path.name + ".lock"), on_wait=lambda: tell(wait_notice(cfg, path))):
        if not rebuild and (kit := load_kit(cfg, root)) is not None:
            return kit  # another process built it while we waited
        # A build killed before its cleanup ran leaves its temporary dir; we hold the lock, so
        # no other build is running and every leftover is garbage.
        for stale in path.parent.glob(path.name + ".building*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = path.with_name(path.name + f".building{os.getpid()}")
        try:
            info = None if from_recipe else install_shipped(cfg, tmp, say)
            if info is None:
                tell(build_notice(cfg, path, from_recipe))
                info = build_kit(cfg, tmp, say)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Kit(path, info)
