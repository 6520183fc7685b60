"""Costs of a GPU cluster from first principles, for the simulator: the paper's settings, on paper.

Why: no one here has 512 GPUs, but the question users ask ("what speed-up should I expect on
mine, how do I split the GPUs?") is about exactly that scale. A decode step, a prefill, a
training step and a weight sync cost what the hardware's roofline says (HBM bandwidth, bf16
FLOPs, interconnect), divided by an efficiency: what fraction of the roofline an engine gets.
The efficiencies come from measurements (`EFFICIENCY`): this project's own engine and trainer on
an H200 (docs/gpu.md), or a production preset (SGLang-class decoding, Megatron-class training),
stated as the assumption it is. The same discrete-event simulator (simulator.py) then runs the
controller's rules over them, with `decode_chunk` steps per event so 27k-token answers stay
cheap to simulate.

A decode step of batch b whose contexts add up to C tokens, on a server of `tp` GPUs:
    t = overhead + (weight bytes / tp + C * kv bytes per token / tp) / (HBM bandwidth * mem_eff)
          + b * 2 * params / tp / (bf16 FLOPs * flops_eff)
(the additive form is a safe upper bound of the roofline's max). Training: 6 * params FLOPs per
token plus attention, at `train_mfu` of the training GPUs' peak; the proximal log-prob forward
is fused (one update per step). Weight sync: the weights' bytes over `sync_gbytes_s`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from areal_graph.perfmodel.cost_model import CostModel, LengthModel, SidePlacement
from areal_graph.perfmodel.fits import LinearFit
from areal_graph.perfmodel.simulator import SimConfig, SimResult, simulate


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_s: float
    bf16_flops: float  # dense
    memory_bytes: float


GPUS = {
    "H800": Gpu("H800", 3.35e12, 989e12, 80e9),  # the paper's GPUs (H100 compute, cut NVLink)
    "H100": Gpu("H100", 3.35e12, 989e12, 80e9),
    "H200": Gpu("H200", 4.8e12, 989e12, 141e9),
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params  # bf16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0  # keys and values, bf16

    @property
    def attn_flops_per_token_per_ctx(self) -> float:
        """Attention FLOPs of one token against one earlier token (QK and AV, all layers)."""
        return 4.0 * self.layers * self.hidden


MODELS = {  # DeepSeek-R1-Distill-Qwen shapes (Qwen2.5 architecture), the paper's starting points
    "0.5B": ModelShape("Qwen2-0.5B shape", 0.494e9, 24, 896, 2, 64),
    "1.5B": ModelShape("R1-Distill-Qwen-1.5B", 1.78e9, 28, 1536, 2, 128),
    "7B": ModelShape("R1-Distill-Qwen-7B", 7.62e9, 28, 3584, 4, 128),
}


@dataclass(frozen=True)
class Efficiency:
    """What share of the roofline an engine reaches, and its fixed cost per decode step."""

    name: str
    decode_overhead_ms: float
    mem_eff: float
    flops_eff: float
    prefill_mfu: float
    train_mfu: float
    sync_gbytes_s: float
    source: str


def h200_measured() -> Efficiency:
    """This project's engine and trainer as measured on one H200 (docs/gpu.md, 2026-11-27): a graphed
    decode step of the 0.5B shape took 2.18 / 2.64 / 4.07 ms at batch 1 / 64 / 256 (prompt 128, 128
    new tokens): fitted here to overhead + bytes / (bandwidth x mem_eff) + rows x FLOPs / (peak x
    flops_eff); the bf16 lean training step ran at 19% MFU; weight sync 0.42 s for 2.35 GiB."""
    shape, gpu = MODELS["0.5B"], GPUS["H200"]
    ctx = 128 + 64  # mean context over the 128 decoded tokens
    steps = {1: 2.18e-3, 64: 2.64e-3, 256: 4.07e-3}
    # per-row slope between batch 64 and 256 -> KV reads and FLOPs per row; the rest is per step
    per_row = (steps[256] - steps[64]) / (256 - 64)
    kv_s = ctx * shape.kv_bytes_per_token / gpu.hbm_bytes_s
    flop_s = 2 * shape.params / gpu.bf16_flops
    scale = per_row / (kv_s + flop_s)  # the same share of both rooflines
    fixed = steps[1] - per_row
    weights_s = shape.weight_bytes / gpu.hbm_bytes_s
    mem_eff = min(1.0, 1.0 / scale)
    overhead = max(fixed - weights_s / mem_eff, 0.0)
    return Efficiency(
        "areal-graph engine + lean trainer (H200, measured)",
        overhead * 1e3,
        mem_eff,
        min(1.0, 1.0 / scale),
        0.19,
        0.19,
        2.35 * 2**30 / 0.42 / 1e9,
        "docs/gpu.md, H200 2026-11-27",
    )


PRODUCTION = Efficiency(
    "production preset (SGLang-class decode, Megatron-class training)",
    0.4,
    0.6,
    0.5,
    0.4,
    0.4,
    25.0,
    "an assumption: decode near 60% of the HBM roofline, 40% MFU training and prefill",
)


def cluster_costs(
    model: ModelShape, gpu: Gpu, eff: Efficiency, tp: int, train_gpus: int, lengths: LengthModel
) -> CostModel:
    """A cost model (costs.py fields) for one inference server of `tp` GPUs and a trainer of `train_gpus`."""
    per_row_ms = (2 * model.params / tp / (gpu.bf16_flops * eff.flops_eff)) * 1e3
    weights_ms = (model.weight_bytes / tp / (gpu.hbm_bytes_s * eff.mem_eff)) * 1e3
    kv_per_row_per_kctx_ms = (1e3 * model.kv_bytes_per_token / tp / (gpu.hbm_bytes_s * eff.mem_eff)) * 1e3
    # paged attention (SGLang, vLLM, this engine's graphed step on a GPU): each row reads its own context
    decode = LinearFit(
        ["1", "rows", "context_k"],
        [eff.decode_overhead_ms + weights_ms, per_row_ms, kv_per_row_per_kctx_ms],
        lo=[1, 1, 0],
        hi=[1, 1e9, 1e12],
    )
    prefill_flops = gpu.bf16_flops * eff.prefill_mfu * tp
    prefill = LinearFit(
        ["1", "tokens_k", "padded_x_width_m"],
        [
            eff.decode_overhead_ms,
            1e3 * 2 * model.params / prefill_flops * 1e3,
            1e6 * model.attn_flops_per_token_per_ctx / 2 / prefill_flops * 1e3,
        ],
        lo=[1, 0, 0],
        hi=[1, 1e12, 1e12],
    )
    train_flops = gpu.bf16_flops * eff.train_mfu * train_gpus
    # 6 N per token (forward + backward) and 2 N for the proximal log-probs' own forward (the paper makes 4
    # PPO updates a step, so they are not the training forward's): 8 N per token trained
    train = LinearFit(["1", "tokens_k"], [0.5, 1e3 * 8 * model.params / train_flops], lo=[1, 0], hi=[1, 1e12])
    return CostModel(
        source=f"first principles: {model.name} on {gpu.name}, {eff.name}",
        machine_cores=list(range(64)),
        calibrated={"max_staleness": 1, "group_size": 16, "max_new_tokens": lengths.max_new_tokens},
        inference=SidePlacement(None, 1),
        training=SidePlacement(None, 1),
        decode_ms=decode,
        prefill_ms=prefill,
        swap_s=0.05,
        model_calls={"train": train},
        sync_s=model.weight_bytes / (eff.sync_gbytes_s * 1e9),
        dispatch_s=0.01,
        collect_s=0.01,
        generation_nodes_s={"reward": 0.05},
        controller_nodes_s={"advantage": 0.1},
        step_overhead_s=0.5,
        lengths=lengths,
        notes=[eff.source],
    )


def long_tail_lengths(
    max_tokens: int,
    median: float,
    sigma: float,
    group_sigma: float,
    group_size: int,
    prompt: int = 300,
    groups: int = 4000,
    seed: int = 0,
) -> LengthModel:
    """Answer lengths of a reasoning run: a lognormal per prompt (some prompts are harder) and per
    answer around it, cut at `max_tokens` (the paper's runs allow up to ~27k-32k tokens)."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        centre = median * math.exp(rng.gauss(0, group_sigma))
        lens = [int(min(max_tokens, max(16, centre * math.exp(rng.gauss(0, sigma))))) for _ in range(group_size)]
        out.append([0, prompt, lens])
    return LengthModel(window=10**6, max_new_tokens=max_tokens, groups=out)


@dataclass
class ClusterRun:
    """One simulated setting: the model, the GPUs, how they are split, the RL settings."""

    model: str = "1.5B"
    gpu: str = "H800"
    gpus: int = 64
    inference_share: float = 0.75  # of the GPUs, for generation (async); sync uses all for both in turn
    tp: int = 1
    batch_prompts: int = 512
    answers: int = 16
    max_tokens: int = 27_000
    median_tokens: float = 7_000.0
    eta: int = 4
    steps: int = 16
    max_running: int = 256
    efficiency: Efficiency = field(default_factory=lambda: PRODUCTION)
    decode_chunk: int = 512

    def lengths(self) -> LengthModel:
        return long_tail_lengths(self.max_tokens, self.median_tokens, 0.45, 0.6, self.answers)


def simulate_cluster(run: ClusterRun, synchronous: bool, split: bool = False) -> SimResult:
    """The run's steps simulated as AReaL runs them. Asynchronous: the split, eta, (eta + 1) B in
    flight. Synchronous (eta 0): with `split`, AReaL's own synchronous variant (the paper's "Sync.
    AReaL" and its eta = 0 ablation: the same generation and training GPUs, taking turns); without,
    every GPU generates, then every GPU trains (the colocated systems such as verl)."""
    model, gpu = MODELS[run.model], GPUS[run.gpu]
    split_infer = max(run.tp, int(round(run.gpus * run.inference_share / run.tp)) * run.tp)
    colocated = synchronous and not split
    infer_gpus = run.gpus if colocated else split_infer
    train_gpus = run.gpus if colocated else max(run.gpus - split_infer, 1)
    servers = max(infer_gpus // run.tp, 1)
    lengths = run.lengths()
    costs = cluster_costs(model, gpu, run.efficiency, run.tp, train_gpus, lengths)
    B = run.batch_prompts * run.answers
    eta = 0 if synchronous else run.eta
    cfg = SimConfig(
        steps=run.steps,
        batch_size=B,
        group_size=run.answers,
        max_staleness=eta,
        max_concurrent=(eta + 1) * B,
        max_running=run.max_running,
        servers=servers,
        max_new_tokens=run.max_tokens,
        prefill_budget=16384,
        max_tokens_per_microbatch=1 << 30,
        machine_cores=list(range(64)),
        decode_chunk=run.decode_chunk,
        cpu_contention=False,
        seed=1,
    )
    return simulate(cfg, costs, passes=1)


def speedup(run: ClusterRun, colocated: bool = True) -> dict[str, float]:
    """Async against AReaL's synchronous variant on the same GPUs and split (the paper's Table 1
    and Figure 5c baseline) and, with `colocated`, against every GPU generating then training: the
    steady step time of each (the second half of the run: the first asynchronous steps wait for the
    pipeline to fill), and the effective throughput the paper reports: tokens trained per step
    (prompts and answers) over the step's time."""
    a, s = simulate_cluster(run, False), simulate_cluster(run, True, split=True)
    trained = run.batch_prompts * run.answers * mean_tokens(run)
    a_step, s_step = a.steady_step_s(), s.steady_step_s()
    out = {
        "async_step_s": a_step,
        "sync_step_s": s_step,
        "speedup": s_step / a_step,
        "async_tokens_per_s": trained / a_step,
        "sync_tokens_per_s": trained / s_step,
        "async_engine_busy": statistics_mean(a.busy, "inference-"),
        "async_trainer_busy": a.busy.get("trainer", 0.0),
        "sync_engine_busy": statistics_mean(s.busy, "inference-"),
        "staleness": a.staleness_mean,
    }
    if colocated:
        c = simulate_cluster(run, True)
        out.update({"colocated_step_s": c.steady_step_s(), "speedup_vs_colocated": c.steady_step_s() / a_step})
    return out


def mean_tokens(run: ClusterRun) -> float:
    """Tokens of one trajectory on average (prompt and answer): what a step trains, per answer."""
    lengths = run.lengths()
    return lengths.groups[0][1] + sum(n for g in lengths.groups for n in g[2]) / sum(len(g[2]) for g in lengths.groups)


def statistics_mean(busy: dict[str, float], prefix: str) -> float:
    vals = [v for k, v in busy.items() if k.startswith(prefix)]
    return sum(vals) / len(vals) if vals else 0.0


def with_train_mfu(eff: Efficiency, mfu: float) -> Efficiency:
    """`eff` with another training efficiency (what the paper's own eta-0 ablation implies: see
    benchmarks/bench_paper_scale.py)."""
    return replace(eff, name=f"{eff.name.split(' (')[0]}, training at {mfu:.0%} MFU", train_mfu=mfu)


def on_gpu(costs: CostModel, layers: int, eff: Efficiency, train_step_s: float) -> CostModel:
    """A CPU-calibrated cost model of a small model moved to a GPU: its forwards launch-bound.

    A graphed decode step of the 0.5B shape (24 layers) spent `eff.decode_overhead_ms` beyond its
    rooflines on the H200; a model of `layers` layers is taken to spend that share per layer, plus
    the engine's own per-step work on the CPU (scheduling and sampling: the calibration's scheduling
    overhead). The trainer's call becomes `train_step_s` (a launch-bound step does not scale with
    tokens); every other cost (weight sync, rewards, the controller's and the rollout's overheads,
    the answers' lengths) stays as calibrated: the same kit and the same code, on a faster CPU."""
    per_step = eff.decode_overhead_ms * layers / 24
    gpu = replace(costs)
    gpu.decode_ms = LinearFit.constant(per_step)
    gpu.prefill_ms = LinearFit.constant(per_step * 1.5)
    gpu.model_calls = {name: LinearFit.constant(train_step_s) for name in costs.model_calls}
    gpu.interference, gpu.engine_preemption = 0.0, 1.0  # the GPU computes, the cores wait
    gpu.background_cpu = {}  # 16 cores: the Python processes do not crowd the GPU's host threads
    gpu.notes = [
        *costs.notes,
        f"moved to a GPU: a decode step {per_step:.2f} ms + the engine's own "
        f"{costs.engine_step_overhead_ms:.2f} ms, a train call {train_step_s * 1e3:.0f} ms",
    ]
    return gpu
