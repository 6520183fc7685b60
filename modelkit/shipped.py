"""Warm starts shipped with the package, so every machine starts from the kit the README measured.

Why ship weights at all, when the kit is rebuilt from its recipe on any machine: an SFT run is
float arithmetic, and its result depends on the CPU's kernels and the thread count (AVX2 and
AVX-512 sum in different orders), so no recipe can promise the same bits on every machine. The
recipe is made robust instead (every kit it builds learns: benchmarks/bench_kit_robustness.py,
and `make test` builds one and checks that it learns), and the warm starts the README's numbers
use (tiny-arith for the main job, tiny-arith-long for the long-tail workflow) ship as well: a
few MB each of safetensors and tokenizer files, with the SHA-256 of every file.

What is shipped is the kit's `model/` directory and its `kit.json`. Its data is not: the
problems are generated from the recipe by Python's `random`, which is the same on every
machine, and checked here against the hashes recorded when the kit was built. A kit is
installed from the shipped files only when they were built from exactly the current recipe
(same fingerprint); a changed recipe builds from the recipe, and `tests/modelkit/test_shipped_kit.py`
fails until the shipped files are refreshed:

    python -m areal_graph.modelkit.shipped tiny-arith          # build from the recipe (2 threads) and ship it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from areal_graph.data.arith import write_jsonl
from areal_graph.modelkit.kit_tasks import kit_task
from areal_graph.modelkit.recipes import BUILTIN_KITS, KitConfig, build_kit

log = logging.getLogger(__name__)

SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"
SHIP_THREADS = 2  # the thread count a shipped kit is built with (the default machine's cores)

Progress = Callable[[str], None]


class ShippedKitError(RuntimeError):
    """The shipped files are damaged (a hash differs): reinstall the package."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def shipped_info(name: str, root: Path = SHIPPED_ROOT) -> dict | None:
    """The kit.json of the shipped kit `name` (None when none is shipped)."""
    path = root / name / "kit.json"
    return json.loads(path.read_text()) if path.exists() else None


def install_shipped(cfg: KitConfig, out: Path, progress: Progress, root: Path = SHIPPED_ROOT) -> dict | None:
    """Install the shipped kit for `cfg` into `out` (model files copied and checked, data
    generated from the recipe and checked); returns its kit.json, or None when no kit of this
    recipe is shipped or the data generated here differs from the shipped kit's (then the kit
    is built from the recipe instead, with a warning)."""
    info = shipped_info(cfg.name, root)
    if info is None or info.get("fingerprint") != cfg.fingerprint():
        return None
    t0 = time.perf_counter()
    progress(f"installing the shipped {cfg.name} warm start (built {info['built_at']} on {info['built_on']})")
    train, test, _ = kit_task(cfg.task).rows(cfg)
    write_jsonl(train, out / "data" / "train.jsonl")
    write_jsonl(test, out / "data" / "test.jsonl")
    for name, want in info["data_sha256"].items():
        got = sha256(out / "data" / name)
        if got != want:
            log.warning(
                "the %s data generated here (%s: sha256 %s) is not what the shipped warm start was built "
                "on (%s): building the kit from its recipe instead",
                cfg.name,
                name,
                got[:12],
                want[:12],
            )
            return None
    src = root / cfg.name / "model"
    (out / "model").mkdir(parents=True, exist_ok=True)
    for name, want in info["model_sha256"].items():
        shutil.copyfile(src / name, out / "model" / name)
        got = sha256(out / "model" / name)
        if got != want:
            raise ShippedKitError(
                f"{src / name}: sha256 {got} differs from {want} in {root / cfg.name / 'kit.json'}; "
                "the package is damaged (reinstall it), or build from the recipe: "
                f"areal-graph init-model {cfg.name} --from-recipe"
            )
    installed = {
        **info,
        "source": "shipped",
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "install_s": round(time.perf_counter() - t0, 2),
    }
    (out / "kit.json").write_text(json.dumps(installed, indent=2) + "\n")
    progress(
        f"done in {installed['install_s']:.0f} s: greedy accuracy {info['warm_start_greedy_accuracy']:.1%} "
        f"(the shipped warm start; built from the recipe in {info['timings']['total_s']:.0f} s)"
    )
    return installed


def ship(kit_path: Path, name: str, root: Path = SHIPPED_ROOT) -> Path:
    """Copy a built kit's model and kit.json (with every file's SHA-256) into `root/name`."""
    info = json.loads((kit_path / "kit.json").read_text())
    if info.get("source") != "recipe":
        raise ValueError(f"{kit_path}: only a kit built from its recipe can be shipped (source {info.get('source')!r})")
    dest = root / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(kit_path / "model", dest / "model")
    info["model_sha256"] = {p.name: sha256(p) for p in sorted((dest / "model").iterdir())}
    info["data_sha256"] = {p.name: sha256(p) for p in sorted((kit_path / "data").iterdir())}
    (dest / "kit.json").write_text(json.dumps(info, indent=2) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    """Build a builtin kit from its recipe in a fresh folder, with SHIP_THREADS threads, and ship it."""
    import torch

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("name", choices=sorted(BUILTIN_KITS))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(SHIP_THREADS)
    with tempfile.TemporaryDirectory(prefix="areal-ship-") as tmp:
        built = Path(tmp) / args.name
        info = build_kit(BUILTIN_KITS[args.name], built, lambda msg: log.info("%s", msg))
        dest = ship(built, args.name)
    log.info("shipped %s into %s (greedy accuracy %.1f%%)", args.name, dest, 100 * info["warm_start_greedy_accuracy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
