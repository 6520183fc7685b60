"""Node kinds for testing the controller in one process, with no model and no server.

They are ordinary user kinds (module-level `NodeKind`s, named in YAML as
`kind: support.fake_kinds:NAME`), so the tests also exercise the registry's user-kind path:

- ROLLOUT: a source that makes `group_size` trajectories per prompt, stamping every
  generated token with the policy version it was told last (`set_policy_version`), like the
  inference servers do. It can fail chosen groups a given number of times, and sleep.
- TRAIN: records every batch it is given (versions, sample and group ids) and the step.
- SLOW: a node that sleeps and records when it ran, for concurrency tests.

Host objects are shared through `HOSTS` (name -> object), so a test can inspect them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from areal_graph.api.fields import cfg
from areal_graph.api.sampling import SamplingParams
from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kind import Call, Hosting, NodeKind
from areal_graph.graph.kinds.common import ROLLOUT_WRITES
from areal_graph.graph.kinds.losses import TrainParams

HOSTS: dict[str, Any] = {}


@dataclass(frozen=True)
class FakeRolloutParams:
    group_size: int = cfg(4)
    sampling: SamplingParams = field(default_factory=SamplingParams, metadata={"check": None, "help": ""})
    response_len: int = cfg(3)
    delay_s: float = cfg(0.0)
    fail: dict[str, int] = cfg({}, None, "group id (as a string) -> how many times it fails")
    slow: dict[str, float] = cfg({}, None, "group id (as a string) -> extra seconds it takes")


class FakeRolloutHost:
    def __init__(
        self,
        name: str,
        group_size: int,
        response_len: int,
        delay_s: float,
        fail: dict[str, int],
        slow: dict[str, float] | None = None,
        **_: Any,
    ) -> None:
        self.group_size, self.response_len, self.delay_s = group_size, response_len, delay_s
        self.slow = {int(k): v for k, v in (slow or {}).items()}
        self.fail = {int(k): v for k, v in fail.items()}
        self.version = 0
        self.attempts: dict[int, int] = {}
        self.running = 0
        self.max_running = 0
        self.lock = threading.Lock()
        HOSTS[name] = self

    def set_policy_version(self, version: int) -> None:
        self.version = version

    def run(self, batch: PackedBatch, group_size: int | None = None, sampling: dict | None = None) -> PackedBatch:
        g = group_size or self.group_size
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            version = self.version  # the policy when generation started
            time.sleep(self.delay_s + sum(self.slow.get(int(g), 0.0) for g in batch["group_id"].tolist()))
            seqs, groups, samples, answers = [], [], [], []
            for i in range(batch.num_seqs):
                gid = int(batch["group_id"][i])
                with self.lock:
                    self.attempts[gid] = self.attempts.get(gid, 0) + 1
                    if self.attempts[gid] <= self.fail.get(gid, 0):
                        raise RuntimeError(f"injected failure of group {gid} (attempt {self.attempts[gid]})")
                prompt = batch.sequence(i, "input_ids").tolist()
                for j in range(g):
                    seqs.append(prompt + [(gid * 7 + j) % 50 + 3] * (self.response_len + j % 2))
                    groups.append(gid)
                    samples.append(gid * g + j)
                    answers.append(batch.meta["answer"][i])
            plen = [batch.sequence(i, "input_ids").numel() for i in range(batch.num_seqs) for _ in range(g)]
            return PackedBatch.from_sequences(
                {
                    "input_ids": seqs,
                    "loss_mask": [[0] * p + [1] * (len(s) - p) for s, p in zip(seqs, plen)],
                    "behav_logprobs": [[0.0] * p + [-1.0] * (len(s) - p) for s, p in zip(seqs, plen)],
                    "versions": [[-1] * p + [version] * (len(s) - p) for s, p in zip(seqs, plen)],
                },
                seqs={"group_id": groups, "sample_id": samples},
                meta={"answer": answers},
                dtypes={"input_ids": torch.int64, "loss_mask": torch.int64, "versions": torch.int64},
            )
        finally:
            with self.lock:
                self.running -= 1


ROLLOUT = NodeKind(
    name="fake_rollout",
    params=FakeRolloutParams,
    model="forbidden",
    phase="generation",
    source=True,
    doc="synthetic trajectories stamped with the current policy version",
    hosting=lambda node, spec: Hosting("rollout", node.name, "support.fake_kinds:FakeRolloutHost", role="rollout"),
    host_args=lambda node, spec, info: {"name": node.name, **asdict(node.params)},
    call=lambda node, spec: Call("run"),
    default_writes=ROLLOUT_WRITES,
)


class FakeTrainHost:
    def __init__(self, name: str) -> None:
        self.batches: list[dict[str, Any]] = []
        HOSTS[name] = self

    def train(self, batch: PackedBatch) -> tuple[PackedBatch, dict[str, float]]:
        self.batches.append(
            {
                "sample_ids": batch["sample_id"].tolist(),
                "group_ids": batch["group_id"].tolist(),
                "versions": batch["versions"][batch["loss_mask"].bool()].tolist(),
                "keys": sorted(batch.keys()),
                "advantages": batch["advantages"].clone(),
            }
        )
        return PackedBatch(batch.cu_seqlens.clone()), {"seqs": float(batch.num_seqs)}


TRAIN = NodeKind(
    name="fake_train",
    params=TrainParams,
    model="required",
    phase="training",
    trains=True,
    doc="records the batches it would train on",
    hosting=lambda node, spec: Hosting(
        f"model-{node.model}", str(node.model), "support.fake_kinds:FakeTrainHost", exclusive=True, role="model"
    ),
    host_args=lambda node, spec, info: {"name": node.name},
    call=lambda node, spec: Call("train"),
    model_role=lambda node: "policy",
)


@dataclass(frozen=True)
class SlowParams:
    sleep_s: float = cfg(0.2)
    process: str = cfg("slow")


class SlowHost:
    def __init__(self, name: str, sleep_s: float) -> None:
        self.sleep_s = sleep_s
        self.spans: list[tuple[float, float]] = []
        HOSTS[name] = self

    def run(self, batch: PackedBatch, out_key: str) -> PackedBatch:
        t0 = time.monotonic()
        time.sleep(self.sleep_s)
        self.spans.append((t0, time.monotonic()))
        return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: torch.zeros(batch.num_seqs)})


SLOW = NodeKind(
    name="slow",
    params=SlowParams,
    model="forbidden",
    phase="training",
    doc="sleeps, then writes zeros (concurrency tests)",
    hosting=lambda node, spec: Hosting(node.params.process, node.name, "support.fake_kinds:SlowHost", exclusive=True),
    host_args=lambda node, spec, info: {"name": node.name, "sleep_s": node.params.sleep_s},
    call=lambda node, spec: Call("run", {"out_key": node.writes[0]}),
)


# ---------------------------------------------------------------------------- function nodes
def parity_reward(batch: PackedBatch, out_key: str) -> PackedBatch:
    """1 for odd sample ids; groups therefore mix 0 and 1 (nothing uniform)."""
    return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: (batch["sample_id"] % 2).float()})


def group_parity_reward(batch: PackedBatch, out_key: str) -> PackedBatch:
    """Uniform within a group: 1 for even group ids, 0 for odd ones (a DAPO filter drops every group)."""
    return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: (batch["group_id"] % 2 == 0).float()})


def mixed_reward(batch: PackedBatch, out_key: str) -> PackedBatch:
    """Groups whose id is a multiple of 3 are uniform (all 0); the others mix 0 and 1."""
    mixed = (batch["group_id"] % 3 != 0) & (batch["sample_id"] % 2 == 1)
    return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: mixed.float()})


def forgets_its_write(batch: PackedBatch, out_key: str) -> PackedBatch:
    return PackedBatch(batch.cu_seqlens.clone())


def judge_like_reward(batch: PackedBatch, out_key: str) -> tuple[PackedBatch, dict[str, float]]:
    """parity_reward, plus a judge's stats: one failed request in odd groups, a per-call mean."""
    odd = float(int(batch["group_id"][0]) % 2)
    return parity_reward(batch, out_key), {"failures": odd, "score_mean": odd}


def always_raises(batch: PackedBatch, out_key: str) -> PackedBatch:
    raise ValueError("a bug in the user's reward")


def drops_half_a_group(batch: PackedBatch) -> PackedBatch:
    return batch.select([0]).select_keys(["group_id", "sample_id"])
