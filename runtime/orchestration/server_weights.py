"""The weights on a run's inference servers: one load at a time, and every load checked.

Why a class of its own: two things load weights onto servers, and they used to be unordered.
A sync (every server loads a new version, which then becomes what a restarted server is
given) runs on the executor's I/O loop when the controller asks; a restore (a restarted
server loads the last committed version) runs when the launcher's watchdog brings a server
back, at any moment. A restore that overlapped a sync could read a version while it was
being written, or load the previous version after the new one had reached that server, and
the server would then serve other weights than its version number says (issue 49). Here
both take turns on one lock, on the loop they both run on, so a restore happens wholly
before a sync's loads or wholly after its commit; with the transports never writing where
the committed version lies (weight_sync.py), what a restore loads is one whole version.

The check: after every load, each server that can say (the embedded backend; vLLM and SGLang
report nothing, and that is logged once) is asked for the version and a digest of the
weights it holds (engines/weights_digest.py), and the digest is compared with that of what
was published for the version, read back from the published file. A server that reports
another version, or other weights, is a `WeightsMismatch` naming the server and the
versions: the run stops with it, it is never retried or passed over.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from typing import Any

from areal_graph.engines.inference.backends.base import WeightsReport
from areal_graph.engines.weights_digest import Samples, digest, dtype_named
from areal_graph.runtime.orchestration.weight_sync import Published, WeightSync

log = logging.getLogger(__name__)

RECENT_VERSIONS = 4  # published versions whose digests are kept, to say which one a server holds instead


class WeightsMismatch(RuntimeError):
    """A server does not hold the weights it was told to load (the message names it and the versions)."""


class ServerWeights:
    """Loads onto the servers, ordered and checked (see module docstring). `names`: each server's
    process name, by index, for messages. Every method runs on the executor's I/O loop."""

    def __init__(self, transport: WeightSync, names: Sequence[str]) -> None:
        self.transport = transport
        self.names = list(names)
        self.checked = 0  # loads whose digest was compared (the others' servers report none)
        self._turn: asyncio.Lock | None = None  # made on the loop that first uses it
        self._samples: collections.OrderedDict[int, tuple[Published, asyncio.Future[Samples | None]]] = (
            collections.OrderedDict()
        )
        self._said_unchecked = False

    def _lock(self) -> asyncio.Lock:
        if self._turn is None:
            self._turn = asyncio.Lock()
        return self._turn

    async def sync(self, pool: Any, published: Published) -> None:
        """Every server of `pool` (a ServerPool) loads `published` and is checked; then it is
        committed (what a restored server gets from now on). A failed load leaves the
        committed version as it was."""
        async with self._lock():
            reading = self._samples_of(published)  # read back what was published while the servers load it
            try:
                await self.transport.apply(pool, published)
            except BaseException:
                await asyncio.gather(reading, return_exceptions=True)
                raise
            await asyncio.gather(*(self._check(i, c, published) for i, c in enumerate(pool.clients)))
            self.transport.commit(published)

    async def restore(self, index: int, client: Any) -> int | None:
        """Server `index` (restarted, on the workflow's model) loads the committed version and is
        checked; returns that version (None: nothing committed yet, its initial weights stay)."""
        async with self._lock():
            published = await self.transport.restore(client)
            if published is None:
                return None
            await self._check(index, client, published)
            return published.version

    async def _check(self, index: int, client: Any, published: Published) -> None:
        report: WeightsReport | None = await client.weights_digest()
        if report is None:
            if not self._said_unchecked:
                self._said_unchecked = True
                log.info(
                    "the %s backend reports no digest of its weights: weight loads are not checked", client.backend
                )
            return
        name = self.names[index] if index < len(self.names) else f"inference-{index}"
        where = f"inference server {name} ({client.base_url})"
        if report.version != published.version:
            raise WeightsMismatch(
                f"{where} was told to load weight version {published.version} and reports version {report.version}"
            )
        samples = await self._samples_of(published)
        if samples is None:
            return
        expected = digest(samples, dtype_named(report.dtype))
        self.checked += 1
        if report.digest == expected:
            return
        others = [
            v
            for v in reversed(self._samples)
            if v != published.version and self._digest_of_version(v, report.dtype) == report.digest
        ]
        held = (
            f"its weights are version {others[0]}'s"
            if others
            else f"they match none of versions {sorted(self._samples)} (a mix of versions, or a damaged load)"
        )
        raise WeightsMismatch(
            f"{where} reports weight version {published.version} but holds other weights: their digest is "
            f"{report.digest}, version {published.version} as published in {published.where} has {expected}; {held}"
        )

    def _samples_of(self, published: Published) -> asyncio.Future[Samples | None]:
        """The values sampled from what was published (read in a thread, once per publish; kept
        for the last RECENT_VERSIONS versions, so a mismatch can say which one a server holds)."""
        kept = self._samples.get(published.version)
        if kept is None or kept[0] is not published:
            kept = (published, asyncio.ensure_future(asyncio.to_thread(self.transport.samples, published)))
            self._samples[published.version] = kept
            self._samples.move_to_end(published.version)
            while len(self._samples) > RECENT_VERSIONS:
                self._samples.popitem(last=False)
        return kept[1]

    def _digest_of_version(self, version: int, dtype: str) -> str | None:
        reading = self._samples[version][1]
        if not reading.done() or reading.exception() is not None:
            return None
        samples = reading.result()
        return None if samples is None else digest(samples, dtype_named(dtype))
