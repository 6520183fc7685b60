"""Async vs sync with a model of a real shape, and the simulator's prediction beside the measurement.

    python benchmarks/bench_gpu_probe.py --out DIR                  # on a GPU (run_gpu_checks.sh part `probe`)
    python benchmarks/bench_gpu_probe.py --device cpu --small ...   # a rehearsal of the plumbing on a CPU

The tiny kits are too small to show what a GPU does with a real model, and no real weights can be
downloaded there: this builds a randomly initialised Qwen2 of the 0.5B shape (hidden 896, 24
layers, 14 heads, 2 KV heads; the kit's 1,024-token vocabulary, so ~0.36B parameters) with the
tiny-arith kit's tokenizer, prompts and reward. A random model ends an answer with probability
~1/1024 a token, so at max_new_tokens 512 about 40% of the answers stop early, spread over
1-511 tokens, and the rest run to 512: a synchronous step waits for the longest. The reward is 0
(it answers nothing); training still computes every gradient. Steps:

1. a calibration run: `ppo_async.yaml` on it, eta 4, `--cal-steps` steps, engine and trainer on
   the device, bf16;
2. the simulator's prediction (costs from 1.) for `--steps` steps of eta 4 and of eta 0;
3. both runs, measured: steps window (first step's start to last step's end).
Output: a table and DIR/gpu_probe.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_model(out: Path, small: bool) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from areal_graph.modelkit.builtin import resolve_model_path

    kit = resolve_model_path("builtin:tiny-arith")
    out.mkdir(parents=True, exist_ok=True)
    for f in kit.iterdir():  # the kit's tokenizer (and chat template): prompts tokenise as in the kit
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")) or f.suffix == ".jinja":
            shutil.copy(f, out / f.name)
    kit_cfg = json.loads((kit / "config.json").read_text())
    torch.manual_seed(0)
    shape = (
        dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        if small
        else dict(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
        )
    )
    cfg = Qwen2Config(
        vocab_size=kit_cfg["vocab_size"],
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=kit_cfg.get("bos_token_id"),
        eos_token_id=kit_cfg.get("eos_token_id"),
        pad_token_id=kit_cfg.get("pad_token_id"),
        **shape,
    )
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    return out


def run(overrides: list[str], run_dir: Path, log: Path, timeout: int) -> float | None:
    from areal_graph.cli.measured_run import measured_run

    return measured_run(ROOT / "workflows" / "ppo_async.yaml", overrides, run_dir, log, timeout, cwd=ROOT).window_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a 2-layer model (rehearsals on a CPU)")
    ap.add_argument("--cal-steps", type=int, default=15)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per run")
    args = ap.parse_args()
    from areal_graph.cli.cmd_simulate import predict
    from areal_graph.graph.loader import load_workflow
    from areal_graph.perfmodel.calibration import load_costs

    work = Path("/tmp/areal-gpu-probe")
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(work / "model", args.small)
    dtype = ["inference.args.dtype=bfloat16", "models.actor.precision=bf16"] if args.device == "cuda" else []
    common = [
        f"models.actor.path={model}",
        f"models.actor.device={args.device}",
        f"inference.args.device={args.device}",
        f"nodes.rollout.sampling.max_new_tokens={args.max_new_tokens}",
        "runtime.eval_every=0",
        "runtime.save_every=0",
        "runtime.max_tokens_per_microbatch=16384",
        *dtype,
    ]
    t0 = time.perf_counter()
    cal = run(
        [*common, f"runtime.steps={args.cal_steps}"], work / "calibration", work / "calibration.log", args.timeout
    )
    out: dict = {"device": args.device, "small": args.small, "calibration_window_s": cal, "rows": []}
    if cal is None:
        print(f"the calibration run failed or timed out: {work / 'calibration.log'}")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_probe.json").write_text(json.dumps(out, indent=1))
        return 1
    costs = load_costs(work / "calibration")
    for label, eta in (("async (eta 4)", 4), ("sync (eta 0)", 0)):
        overrides = [*common, f"runtime.steps={args.steps}", f"runtime.max_staleness={eta}"]
        pred = predict(load_workflow(ROOT / "workflows" / "ppo_async.yaml", overrides), costs, seeds=3)
        measured = run(overrides, work / f"eta{eta}", work / f"eta{eta}.log", args.timeout)
        err = (pred["steps_window_s"] - measured) / measured if measured else None
        out["rows"].append(
            {
                "label": label,
                "predicted_s": pred["steps_window_s"],
                "measured_s": measured,
                "error": err,
                "predicted_engine_busy": pred["busy"].get("inference-0"),
                "extrapolates": pred["extrapolates"],
            }
        )
        print(
            f"{label:14s} predicted {pred['steps_window_s']:7.2f} s  measured "
            f"{measured if measured is None else round(measured, 2)} s  error "
            f"{'-' if err is None else f'{err:+.1%}'}",
            flush=True,
        )
    rows = {r["label"]: r for r in out["rows"]}
    a, s = rows["async (eta 4)"], rows["sync (eta 0)"]
    if a["measured_s"] and s["measured_s"]:
        out["speedup_measured"] = s["measured_s"] / a["measured_s"]
        out["speedup_predicted"] = s["predicted_s"] / a["predicted_s"]
        print(f"async / sync: measured {out['speedup_measured']:.2f}x, predicted {out['speedup_predicted']:.2f}x")
    out["seconds"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_probe.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
