"""PackedBatch <-> BatchChunk stream: exact round trips and clear errors on malformed streams."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.data.packed import PackedBatch
from areal_graph.protos import worker_pb2 as pb
from areal_graph.runtime.rpc.tensor_codec import (
    DTYPES,
    MalformedStream,
    decode_batch,
    encode_batch,
    encode_tensor,
)


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen, dtype=torch.float64) * 100
        return t.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype)


def _same(a: PackedBatch, b: PackedBatch) -> None:
    assert torch.equal(a.cu_seqlens, b.cu_seqlens) and b.cu_seqlens.dtype == torch.int32
    for part in ("tokens", "seqs"):
        da, db = getattr(a, part), getattr(b, part)
        assert list(da) == list(db)
        for k in da:
            assert da[k].dtype == db[k].dtype and da[k].shape == db[k].shape, k
            # bitwise equality, so NaN payloads and -0.0 are checked too
            assert da[k].contiguous().view(torch.uint8).tolist() == db[k].contiguous().view(torch.uint8).tolist(), k
    assert a.meta == b.meta


@st.composite
def batches(draw) -> PackedBatch:
    lens = draw(st.lists(st.integers(0, 40), min_size=0, max_size=8))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    n, total = len(lens), sum(lens)
    cu = torch.zeros(n + 1, dtype=torch.int32)
    if n:
        cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    names = sorted(DTYPES)
    tok_dtypes = draw(st.lists(st.sampled_from(names), max_size=4))
    seq_dtypes = draw(st.lists(st.sampled_from(names), max_size=3))
    tokens = {f"t{i}_{d}": _random_tensor(DTYPES[d], (total,), gen) for i, d in enumerate(tok_dtypes)}
    seqs = {
        f"s{i}_{d}": _random_tensor(DTYPES[d], (n,) + ((3,) if i % 2 else ()), gen) for i, d in enumerate(seq_dtypes)
    }
    text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
    meta_keys = draw(st.lists(st.sampled_from(["answer", "prompt_id", "ü-key"]), unique=True, max_size=2))
    meta = {k: draw(st.lists(text, min_size=n, max_size=n)) for k in meta_keys}
    return PackedBatch(cu, tokens, seqs, meta)


@settings(max_examples=80, deadline=None)
@given(batch=batches(), chunk_bytes=st.sampled_from([1, 3, 7, 64, 1000, 1 << 20]))
def test_round_trip_is_exact(batch: PackedBatch, chunk_bytes: int) -> None:
    chunks = list(encode_batch(batch, chunk_bytes))
    assert all(c.ByteSize() <= chunk_bytes + 64 for c in chunks if c.HasField("data"))
    _same(batch, decode_batch(iter(chunks)))
    # serialised and parsed again, as the real wire does
    _same(batch, decode_batch(pb.BatchChunk.FromString(c.SerializeToString()) for c in chunks))


def test_empty_batch_round_trips() -> None:
    b = PackedBatch(torch.zeros(1, dtype=torch.int32))
    _same(b, decode_batch(encode_batch(b)))
    b2 = PackedBatch(torch.zeros(1, dtype=torch.int32), {"x": torch.zeros(0)}, {"r": torch.zeros(0)}, {"m": []})
    out = decode_batch(encode_batch(b2))
    _same(b2, out)
    assert "m" in out.meta


def test_values_match_an_independent_reference() -> None:
    """bfloat16 bits and a float64 value decoded by hand from the raw bytes."""
    b = PackedBatch.from_sequences({"lp": [[-0.5, 1.25], [3.0]]}, dtypes={"lp": torch.float64})
    b.tokens["h"] = torch.tensor([1.0, -2.0, 0.5]).bfloat16()
    chunks = list(encode_batch(b, chunk_bytes=1 << 20))
    heads = [c.tensor for c in chunks if c.HasField("tensor")]
    datas = [c.data.data for c in chunks if c.HasField("data")]
    idx = [h.key for h in heads].index("lp")
    import struct

    assert struct.unpack("<3d", datas[idx]) == (-0.5, 1.25, 3.0)
    h = [h.key for h in heads].index("h")
    assert heads[h].dtype == "bfloat16" and datas[h] == bytes.fromhex("803f00c0003f")  # bf16 of 1,-2,0.5 (LE)


def test_large_tensor_is_chunked_and_round_trips() -> None:
    x = torch.arange(3_000_000, dtype=torch.int64)
    b = PackedBatch(torch.tensor([0, 3_000_000], dtype=torch.int32), {"x": x})
    chunks = list(encode_batch(b))
    assert sum(c.HasField("data") for c in chunks) == 23 + 1  # ceil(24e6 / 2**20) chunks + cu_seqlens
    assert torch.equal(decode_batch(chunks).tokens["x"], x)


def test_non_contiguous_input_is_handled() -> None:
    x = torch.arange(20, dtype=torch.float32)[::2]
    b = PackedBatch(torch.tensor([0, 10], dtype=torch.int32), {"x": x})
    assert torch.equal(decode_batch(encode_batch(b, 7)).tokens["x"], x)


def _chunks() -> list[pb.BatchChunk]:
    b = PackedBatch.from_sequences({"x": [[1, 2, 3], [4]]}, meta={"a": ["p", "q"]})
    return list(encode_batch(b, chunk_bytes=8))


def test_truncated_stream_is_an_error() -> None:
    with pytest.raises(MalformedStream, match="truncated"):
        decode_batch(_chunks()[:-1])


def test_missing_data_chunk_is_an_error() -> None:
    chunks = _chunks()
    i = max(i for i, c in enumerate(chunks) if c.HasField("data"))
    with pytest.raises(MalformedStream, match="missing chunks"):
        decode_batch(chunks[:i] + chunks[i + 1 :])


def test_extra_bytes_are_an_error() -> None:
    chunks = _chunks()
    i = max(i for i, c in enumerate(chunks) if c.HasField("data"))
    with pytest.raises(MalformedStream, match="more than"):
        decode_batch(chunks[: i + 1] + [chunks[i]] + chunks[i + 1 :])


def test_size_mismatch_in_header_is_an_error() -> None:
    chunks = _chunks()
    for c in chunks:
        if c.HasField("tensor") and c.tensor.key == "x":
            c.tensor.nbytes += 8
    with pytest.raises(MalformedStream, match="need 32"):
        decode_batch(chunks)


def test_unknown_dtype_is_an_error() -> None:
    chunks = _chunks()
    for c in chunks:
        if c.HasField("tensor") and c.tensor.key == "x":
            c.tensor.dtype = "complex64"
    with pytest.raises(MalformedStream, match="unknown dtype 'complex64'"):
        decode_batch(chunks)


def test_data_before_header_and_missing_meta_key_are_errors() -> None:
    with pytest.raises(MalformedStream, match="without a tensor header"):
        decode_batch([pb.BatchChunk(data=pb.TensorData(data=b"x"))])
    chunks = [c for c in _chunks() if not c.HasField("meta")]
    with pytest.raises(MalformedStream, match="meta keys"):
        decode_batch(chunks)


def test_inconsistent_batch_is_an_error() -> None:
    chunks = list(encode_tensor(pb.SECTION_CU_SEQLENS, "cu_seqlens", torch.tensor([0, 2], dtype=torch.int32)))
    chunks += list(encode_tensor(pb.SECTION_TOKENS, "x", torch.zeros(3)))
    chunks.append(pb.BatchChunk(end=pb.BatchEnd(num_tensors=2, num_meta_keys=0, total_bytes=8 + 12)))
    with pytest.raises(MalformedStream, match="inconsistent"):
        decode_batch(chunks)


def test_unsupported_dtype_and_non_string_meta_are_refused_on_encode() -> None:
    b = PackedBatch(torch.tensor([0, 2], dtype=torch.int32), {"c": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(TypeError, match="complex64"):
        list(encode_batch(b))
    b = PackedBatch(torch.tensor([0, 1], dtype=torch.int32), meta={"m": [3]})
    with pytest.raises(TypeError, match="only str"):
        list(encode_batch(b))
