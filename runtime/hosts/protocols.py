"""What each hosted object serves: the methods the owner calls on it over RPC, by name.

Why Protocols: a call crosses a process boundary as a method *name* (`WorkerClient.call(obj,
"publish_weights", ...)`, a node kind's `Call("train", ...)`), and the worker looks it up with
getattr. Nothing but these declarations ties the name the owner sends to the method the host
defines, so the type checker (tests/test_types.py) checks every host class against its
protocol, and the owner spells the names through them (`ModelService.publish_weights.__name__`):
a renamed or misspelt method fails the test run, not a run twenty minutes in.
tests/runtime/hosts/test_host_interfaces.py checks the other half: every node kind's `Call` names a method
of its host class that takes the call's arguments.
"""

from __future__ import annotations

from typing import Any, Protocol

from areal_graph.data.packed import PackedBatch


class ModelService(Protocol):
    """One model (policy or critic) in the `model-<name>` worker: ModelHost, or
    DataParallelModelHost (rank 0 of dp_size > 1, relaying every call to the other ranks)."""

    def logprob(
        self, batch: PackedBatch, out_key: str, max_tokens_per_mb: int, temperature: float = 1.0
    ) -> PackedBatch: ...

    def values(self, batch: PackedBatch, out_key: str, max_tokens_per_mb: int) -> PackedBatch: ...

    def train(
        self,
        batch: PackedBatch,
        params: dict[str, Any],
        max_tokens_per_mb: int,
        temperature: float = 1.0,
        fused_prox: bool = False,
        policy_version: int | None = None,
    ) -> tuple[PackedBatch, dict[str, float]]: ...

    def publish_weights(self, path: str) -> list[dict]:
        """Write the weights into the shared-memory file `path`; returns its manifest."""
        ...

    def export_weights(self, path: str, with_tokenizer: bool = False) -> str: ...

    def export_adapter(self, path: str) -> str:
        """LoRA: the adapters alone (peft's layout) into the directory `path`."""
        ...

    def save_checkpoint(self, path: str) -> str: ...

    def load_checkpoint(self, path: str) -> str: ...


class RolloutService(Protocol):
    """The rollout worker's object: generates a prompt batch's groups against the servers."""

    def run(self, batch: PackedBatch, group_size: int | None = None, sampling: dict | None = None) -> PackedBatch: ...


class RewardService(Protocol):
    """The reward worker's object: scores trajectories into the key `out_key`."""

    def score(self, batch: PackedBatch, out_key: str = "rewards") -> tuple[PackedBatch, dict[str, float]]: ...


class RewardModelService(Protocol):
    """A `reward_model` node's worker object: a sequence classifier scoring whole trajectories."""

    def score(
        self, batch: PackedBatch, out_key: str = "rm_reward", max_tokens_per_mb: int = 4096
    ) -> tuple[PackedBatch, dict[str, float]]: ...


class FunctionService(Protocol):
    """A user function node's object, in the controller or the functions worker."""

    def run(self, batch: PackedBatch) -> Any: ...
