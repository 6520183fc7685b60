"""perfmodel/engine_probe.py: the engine's steps measured alone on a real (tiny) model."""

from __future__ import annotations

from areal_graph.perfmodel.engine_probe import probe_decode, probe_verify


def test_the_decode_probe_measures_every_batch_size_and_width(tiny_model_dir):
    """probe_decode: the engine's decode step alone at 1, 2, 4, ... rows up to the run's largest
    (which need not be a power of two) and at each width asked for."""
    got = probe_decode(str(tiny_model_dir), 6, [10, 30])
    assert sorted({r for r, _, _ in got}) == [1, 2, 4, 6]
    assert sorted({w for _, w, _ in got}) == [10, 30]
    assert len(got) == 8 and all(t > 0 for *_, t in got)


def test_the_verify_probe_measures_each_shape_beside_its_plain_step(tiny_model_dir):
    """probe_verify: the engine's verifying step alone (proposals looked up, the packed forward,
    every fed position sampled, the rows advanced) at 1, 2, 4, ... rows, each width and each
    proposal length, with the plain step of the same rows and width; feeding more costs more."""
    got = probe_verify(str(tiny_model_dir), 4, [10, 30], drafts=(1, 4))
    assert got is not None
    assert [(r, w, e) for r, w, e, _, _ in got] == [(r, w, r * k) for w in (10, 30) for r in (1, 2, 4) for k in (1, 4)]
    assert all(v > 0 and p > 0 for *_, v, p in got)
    by = {(r, w, e): v for r, w, e, v, _ in got}
    assert sum(by[(r, w, 4 * r)] for r in (1, 2, 4) for w in (10, 30)) > sum(
        by[(r, w, r)] for r in (1, 2, 4) for w in (10, 30)
    )


def test_the_verify_probe_takes_the_batch_sizes_asked_for(tiny_model_dir):
    """`rows` instead of the grid (benchmarks/bench_gpu.py asks for 1, 64 and 256 on a GPU): only
    those batch sizes, in order, each verifying step beside its own plain step."""
    got = probe_verify(str(tiny_model_dir), 3, [12], drafts=(2,), rows=[3, 1])
    assert got is not None and [(r, w, e) for r, w, e, _, _ in got] == [(3, 12, 6), (1, 12, 2)]
    assert all(v > 0 and p > 0 for *_, v, p in got)
