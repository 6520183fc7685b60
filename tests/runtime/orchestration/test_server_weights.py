"""ServerWeights (runtime/orchestration/server_weights.py): a restore and a sync's loads take turns,
a version becomes what a restarted server gets only once every server holds it, and a server that
reports other weights (or another version) than it was given is an error naming it and the
versions. Fake servers hold real tensors and answer with real digests (engines/weights_digest.py);
the transport is the real shared-memory one. Real server processes: test_restore_during_sync.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import torch

from areal_graph.engines import shared_weights
from areal_graph.engines.inference.backends.base import WeightsReport
from areal_graph.engines.weights_digest import digest, sample_tensors
from areal_graph.runtime.orchestration.server_weights import ServerWeights, WeightsMismatch
from areal_graph.runtime.orchestration.weight_sync import SharedMemorySync


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"w": torch.randn(6, 4, generator=g), "b": torch.randn(4, generator=g)}


class Trainer:
    """The actor's host: publishes `weights(self.version)` into the file it is given."""

    def __init__(self) -> None:
        self.version = 0

    def __call__(self, method: str, /, **args: Any) -> Any:
        return shared_weights.publish(args["path"], weights(self.version))


class Server:
    """One server's client: loads copies of what the file holds (after `delay_s`), answers digests.
    `spoil`: what it does to the weights it loaded (a server that does not hold what it says)."""

    def __init__(self, name: str, log: list[str], delay_s: float = 0.0, backend: str = "embedded") -> None:
        self.base_url, self.backend, self.log, self.delay_s = f"http://{name}", backend, log, delay_s
        self.state: dict[str, torch.Tensor] = {}
        self.version = 0
        self.spoil = lambda state, version: (state, version)
        self.reports = backend == "embedded"

    async def update_weights_from_shared_memory(self, path: str, manifest: list[dict], version: int) -> None:
        self.log.append(f"{self.base_url} loads {version}")
        await asyncio.sleep(self.delay_s)
        state = {k: v.clone() for k, v in shared_weights.read(path, manifest).items()}
        self.state, self.version = self.spoil(state, version)
        self.log.append(f"{self.base_url} holds {version}")

    async def weights_digest(self) -> WeightsReport | None:
        if not self.reports:
            return None
        return WeightsReport(self.version, digest(sample_tensors(self.state), torch.float32), "float32")


class Pool:
    def __init__(self, clients: list[Server]) -> None:
        self.clients = clients

    async def update_weights_from_shared_memory(self, path: str, manifest: list[dict], version: int) -> None:
        await asyncio.gather(*(c.update_weights_from_shared_memory(path, manifest, version) for c in self.clients))


def setup(tmp_path, servers: int = 2, delay_s: float = 0.0) -> tuple[ServerWeights, Trainer, Pool, list[str]]:
    trainer, log = Trainer(), []
    transport = SharedMemorySync(trainer, str(tmp_path / "w"))
    pool = Pool([Server(f"s{i}", log, delay_s) for i in range(servers)])
    return ServerWeights(transport, [f"inference-{i}" for i in range(servers)]), trainer, pool, log


async def sync(sw: ServerWeights, trainer: Trainer, pool: Pool, version: int) -> None:
    trainer.version = version
    published = await asyncio.to_thread(sw.transport.publish, version)
    await sw.sync(pool, published)


def test_every_server_is_checked_and_a_restored_server_gets_the_committed_version(tmp_path):
    sw, trainer, pool, _ = setup(tmp_path)

    async def main() -> int | None:
        for v in (1, 2, 3):
            await sync(sw, trainer, pool, v)
        return await sw.restore(1, pool.clients[1])

    assert asyncio.run(main()) == 3
    assert sw.checked == 3 * 2 + 1
    assert all(torch.equal(c.state["w"], weights(3)["w"]) and c.version == 3 for c in pool.clients)


def test_a_restore_waits_for_the_sync_under_way_and_then_loads_the_new_version(tmp_path):
    """The restore is asked for while the servers load version 2: it runs after the commit,
    so the restarted server ends on version 2, whole, never on 1 after having had 2."""
    sw, trainer, pool, log = setup(tmp_path, delay_s=0.05)
    restarted = Server("restarted", log)

    async def main() -> int | None:
        await sync(sw, trainer, pool, 1)
        syncing = asyncio.create_task(sync(sw, trainer, pool, 2))
        await asyncio.sleep(0.01)  # the servers are loading version 2
        got = await sw.restore(0, restarted)
        await syncing
        return got

    assert asyncio.run(main()) == 2
    assert log.index("http://restarted loads 2") > max(log.index(f"http://s{i} holds 2") for i in range(2))
    assert restarted.version == 2 and torch.equal(restarted.state["b"], weights(2)["b"])


def test_a_sync_waits_for_a_restore_under_way(tmp_path):
    sw, trainer, pool, log = setup(tmp_path)
    restarted = Server("restarted", log, delay_s=0.05)

    async def main() -> None:
        await sync(sw, trainer, pool, 1)
        restoring = asyncio.create_task(sw.restore(0, restarted))
        await asyncio.sleep(0.01)
        await sync(sw, trainer, pool, 2)
        assert await restoring == 1

    asyncio.run(main())
    assert log.index("http://restarted holds 1") < log.index("http://s0 loads 2")


def test_a_server_holding_another_versions_weights_is_named_with_both_versions(tmp_path):
    sw, trainer, pool, _ = setup(tmp_path)

    async def main() -> None:
        for v in (1, 2):
            await sync(sw, trainer, pool, v)
        pool.clients[1].spoil = lambda state, version: (weights(2), version)  # loads 3, keeps 2's
        await sync(sw, trainer, pool, 3)

    with pytest.raises(WeightsMismatch) as err:
        asyncio.run(main())
    said = str(err.value)
    assert "inference server inference-1 (http://s1)" in said and "reports weight version 3" in said
    assert "its weights are version 2's" in said
    assert sw.transport.last is not None and sw.transport.last.version == 2  # not committed


def test_a_mix_of_versions_and_a_wrong_label_are_errors_too(tmp_path):
    sw, trainer, pool, _ = setup(tmp_path, servers=1)

    async def mixed() -> None:
        await sync(sw, trainer, pool, 1)
        pool.clients[0].spoil = lambda state, version: ({**state, "b": weights(1)["b"]}, version)
        await sync(sw, trainer, pool, 2)

    with pytest.raises(WeightsMismatch, match="match none of versions \\[1, 2\\] \\(a mix of versions"):
        asyncio.run(mixed())

    (tmp_path / "label").mkdir()
    sw, trainer, pool, _ = setup(tmp_path / "label", servers=1)
    pool.clients[0].spoil = lambda state, version: (state, version - 1)
    with pytest.raises(WeightsMismatch, match="was told to load weight version 1 and reports version 0"):
        asyncio.run(sync(sw, trainer, pool, 1))


def test_a_backend_that_reports_no_digest_goes_unchecked_and_says_so_once(tmp_path, caplog):
    trainer, log = Trainer(), []
    pool = Pool([Server("v0", log, backend="vllm"), Server("v1", log, backend="vllm")])
    sw = ServerWeights(SharedMemorySync(trainer, str(tmp_path / "w")), ["inference-0", "inference-1"])

    async def main() -> None:
        for v in (1, 2):
            await sync(sw, trainer, pool, v)

    with caplog.at_level(logging.INFO, logger="areal_graph.runtime.orchestration.server_weights"):
        asyncio.run(main())
    assert sw.checked == 0 and sw.transport.last.version == 2
    assert [r.getMessage() for r in caplog.records] == [
        "the vllm backend reports no digest of its weights: weight loads are not checked"
    ]
