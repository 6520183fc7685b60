"""What a user is told before a kit is built from its recipe, or while waiting for another
process's build: which kit, why it is built (no warm start shipped for it), about how long, and
where it goes.

Why: a kit with no shipped warm start is built by SFT the first time anything names it, which
takes from 2 to 12 minutes on 2 cores; `areal-graph eval builtin:tiny-guess` used to start that
silently. `modelkit/kit_cache.py ensure_kit` is the one place every kit is made (run, eval,
serve, init-model, benchmarks), and it says this there, once, before the build starts.

BUILD_SECONDS records each builtin kit's measured build from its recipe (kit.json `timings.total_s`
of a build on 2 threads); a kit whose warm start ships has the same number in its shipped
kit.json, read from there. docs/datasets.md's kits table states the same numbers
(tests/modelkit/test_kit_notice.py keeps them in step).
"""

from __future__ import annotations

from pathlib import Path

from areal_graph.modelkit.recipes import KitConfig
from areal_graph.modelkit.shipped import shipped_info

# Build from the recipe, seconds on 2 threads (AMD EPYC, torch 2.13 CPU), from each build's kit.json.
BUILD_SECONDS: dict[str, tuple[float, int]] = {
    "tiny-arith": (109, 2),
    "tiny-arith-long": (375, 2),
    "tiny-arith-ladder": (156, 2),
    "tiny-calc": (130, 2),
    "tiny-guess": (731, 2),
    # Not timed alone yet (a build on a loaded machine ran 2.5x slower): tiny-arith's model, lessons
    # and steps on reasoning-gym's problems, so tiny-arith's time plus its data generation.
    "tiny-rg-arith": (120, 2),
}


def expected_build(cfg: KitConfig) -> tuple[float, int] | None:
    """(seconds, threads) a build of `cfg` from its recipe took when measured; None when never
    measured. The shipped kit.json of this recipe is the measurement where there is one."""
    info = shipped_info(cfg.name)
    if info is not None and info.get("fingerprint") == cfg.fingerprint() and "timings" in info:
        return float(info["timings"]["total_s"]), int(info.get("torch_threads", 2))
    return BUILD_SECONDS.get(cfg.name)


def duration(seconds: float) -> str:
    """`about 12 min`, `about 2 min`, `about 50 s`."""
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {round(seconds / 60):.0f} min"


def expected_text(cfg: KitConfig) -> str:
    """`about 12 min on 2 cores`, or what is said when the build was never timed."""
    measured = expected_build(cfg)
    if measured is None:
        return "its build time is not measured yet (minutes on a few cores)"
    seconds, threads = measured
    return f"{duration(seconds)} on {threads} core{'s' if threads != 1 else ''}"


def why_from_recipe(cfg: KitConfig, from_recipe: bool) -> str:
    """Why `cfg` is built rather than installed from a shipped warm start."""
    if from_recipe:
        return "built from the recipe as asked"
    info = shipped_info(cfg.name)
    if info is None:
        return "no shipped warm start for this kit"
    if info.get("fingerprint") != cfg.fingerprint():
        return "the shipped warm start is of another version of this recipe"
    return "the shipped warm start's data differs from the data generated here"


def build_notice(cfg: KitConfig, path: Path, from_recipe: bool = False) -> str:
    """The line said once before a kit is built from its recipe."""
    return (
        f"building kit {cfg.name} from its recipe ({why_from_recipe(cfg, from_recipe)}): "
        f"{expected_text(cfg)}; into {path} (once; later runs reuse it)"
    )


def wait_notice(cfg: KitConfig, path: Path) -> str:
    """The line said when another process holds the kit's lock (it is making the kit)."""
    info = shipped_info(cfg.name)
    if info is not None and info.get("fingerprint") == cfg.fingerprint():
        how = "installing the shipped warm start takes seconds"
    else:
        how = f"a build from the recipe takes {expected_text(cfg)}"
    return f"waiting for another process that is making kit {cfg.name} into {path} ({how})"
