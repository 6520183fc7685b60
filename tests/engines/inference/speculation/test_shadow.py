"""Shadow acceptance (engines/inference/speculation/shadow.py): with speculation off the engine
counts what speculation would have accepted. The counting changes no token; for one request at a
time it equals the live speculator's counts exactly (its policy forced to propose `max_draft`
tokens at every step), greedy and seeded; its bookkeeping stays bounded; and the counts reach the
engine's stats, the server's trace records and `areal-graph trace`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection
from types import SimpleNamespace

import pytest
import torch

from areal_graph.cli import cmd_trace
from areal_graph.data.datasets import load_prompts
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.inference.speculation.drafts import SOURCES
from areal_graph.engines.inference.speculation.shadow import ShadowSpeculation
from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings
from areal_graph.modelkit.kit_cache import ensure_kit
from areal_graph.modelkit.recipes import BUILTIN_KITS
from areal_graph.trace_analysis.speculation_summary import shadow_summary
from areal_graph.trace_analysis.trace_model import load_timeline
from support.tiny_models import build_spiky_qwen2

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EVERY_STEP = SpeculativeSettings(shadow_every=1)  # every prompt shadowed
OFF = SpeculativeSettings(shadow_every=0)


# --------------------------------------------------------------------------- the counter alone
def _req(rid: str, prompt: list[int], max_new: int = 64) -> SimpleNamespace:
    return SimpleNamespace(
        rid=rid,
        prompt=prompt,
        params=SimpleNamespace(max_new_tokens=max_new),
        output_ids=[],
        constraint=None,
        finish_reason=None,
    )


def _step(shadow: ShadowSpeculation, rows: list[SimpleNamespace], tokens: list[int], ends: Collection[int] = ()):
    """One plain decode step as the engine runs it: propose, emit a token per row, resolve the
    finished ones, compare."""
    shadow.before_step(rows)
    for i, (r, t) in enumerate(zip(rows, tokens)):
        r.output_ids.append(t)
        if i in ends:
            r.finish_reason = "stop"
            shadow.finish(r)
    shadow.after_step()


def test_a_mismatch_a_full_match_and_a_finishing_token_resolve_as_a_verifying_step_would():
    """Prompt 1 2 3 4 5 6 1 2: after "1 2" the prompt continues 3 4 5 6 (a `prompt` proposal)."""
    shadow = ShadowSpeculation(SpeculativeSettings(shadow_every=1, max_draft=4))
    r = _req("a", [1, 2, 3, 4, 5, 6, 1, 2])
    r.output_ids = [9]  # the prefill's token: the tail 2 9 matches nothing
    _step(shadow, [r], [3])  # no proposal at tail "2 9"
    assert shadow.stats()["proposals"]["prompt"] == 0
    r.output_ids = [1, 2]  # restart the answer by hand: its tail "1 2" matches the prompt
    shadow.drafts.extend("a", r.output_ids)
    _step(shadow, [r], [3])  # proposes 3 4 5 6, token 3 matches
    assert shadow.bookkeeping()["open"] == 1
    _step(shadow, [r], [4])
    _step(shadow, [r], [7])  # position 3 differs: 2 accepted, 3 reached
    st = shadow.stats()
    assert (st["proposed"]["prompt"], st["accepted"]["prompt"]) == (4, 2)
    one = st["by_rows"]["1"]
    assert (one["reached"], one["accepted_at"]) == ([1, 1, 1, 0], [1, 1, 0, 0])
    assert one["acceptance_by_position"][:3] == [1.0, 1.0, 0.0] and one["mean_accepted"] == 2.0
    assert one["tokens_per_forward"] == 3.0


def test_after_a_full_match_it_waits_for_the_extra_token_and_a_finishing_match_is_not_accepted():
    shadow = ShadowSpeculation(SpeculativeSettings(shadow_every=1, max_draft=2))
    r = _req("a", [5, 6, 7, 8, 5, 6, 7, 8, 5])
    r.output_ids = [6]  # tail "8 5 6" → the prompt continues 7 8
    for t in (7, 8):
        _step(shadow, [r], [t])
    st = shadow.stats()
    assert (st["proposed"]["prompt"], st["accepted"]["prompt"]) == (2, 2)
    # the verifying step would have emitted one more token (sampled after 8): no proposal at this step
    shadow.before_step([r])
    assert shadow.bookkeeping()["open"] == 0
    r.output_ids.append(5)
    shadow.after_step()
    # now "6 7 8 5" proposes 6 7; 6 matches and ends the request: reached, not accepted (the
    # verifying step emits it as the token it always emits)
    _step(shadow, [r], [6], ends={0})
    st = shadow.stats()
    assert (sum(st["proposed"].values()), sum(st["accepted"].values())) == (4, 2)
    assert st["by_rows"]["1"]["reached"] == [2, 1] and st["by_rows"]["1"]["accepted_at"] == [1, 1]
    assert shadow.bookkeeping() == {"rows": 0, "groups": 0, "open": 0, "resume": 0}


def test_an_abort_or_a_weight_change_drops_the_open_proposal_uncounted():
    shadow = ShadowSpeculation(SpeculativeSettings(shadow_every=1, max_draft=4))
    a, b = _req("a", [1, 2, 3, 4, 1, 2]), _req("b", [1, 2, 3, 4, 1, 2])
    a.output_ids, b.output_ids = [9, 1, 2], [8, 1, 2]
    _step(shadow, [a, b], [3, 3])  # both propose 3 4 1 2 (the prompt after "1 2"); 3 matches
    assert shadow.bookkeeping()["open"] == 2
    shadow.interrupt()  # a weight update
    assert shadow.stats()["dropped"] == 2 and shadow.bookkeeping()["open"] == 0
    shadow.before_step([a, b])  # "1 2 3" proposes again
    assert shadow.bookkeeping()["open"] == 2
    a.finish_reason = "abort"
    shadow.finish(a)
    st = shadow.stats()
    assert st["dropped"] == 3 and sum(st["proposed"].values()) == 0  # nothing was resolved
    assert shadow.bookkeeping() == {"rows": 1, "groups": 1, "open": 1, "resume": 0}


def test_only_the_prompts_picked_by_their_tokens_are_shadowed():
    shadow = ShadowSpeculation(SpeculativeSettings(shadow_every=4))
    rows = [_req(str(i), [i, i + 1, i + 2]) for i in range(200)]
    for r in rows:
        r.output_ids = [0]
    shadow.before_step(rows)
    picked = {r.rid for r in rows if hash(tuple(r.prompt)) % 4 == 0}
    assert shadow.stats()["shadowed"] == len(picked) and 20 < len(picked) < 80
    assert shadow.drafts.stats()["live"] == len(picked)  # the others are no draft material either
    with pytest.raises(ValueError, match="shadow_every"):
        ShadowSpeculation(SpeculativeSettings(shadow_every=0))


# --------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    kit = ensure_kit(BUILTIN_KITS["tiny-arith"], root=tmp_path_factory.mktemp("cache"))
    model = str(kit.path / "model")
    tokenizer = EmbeddedEngine(model).tokenizer
    prompts, _ = load_prompts(kit.path / "data" / "test.jsonl", tokenizer)
    return model, [p.input_ids for p in prompts[:48]]


def _forced(engine: EmbeddedEngine) -> EmbeddedEngine:
    """The live speculator proposing `max_draft` tokens at every step, verified as proposed."""
    assert engine._spec is not None
    policy, k = engine._spec.policy, engine._spec.settings.max_draft
    policy.speculate = lambda rows: True  # type: ignore[method-assign]
    policy.draft_length = lambda rid, rows=1, cost=None: k  # type: ignore[method-assign]
    policy.cost_measured = lambda rows: False  # type: ignore[method-assign]
    return engine


def _one_at_a_time(engine: EmbeddedEngine, requests: list[tuple[list[int], SamplingParams]]):
    with engine:
        results = [engine.submit(p, sp).result(timeout=600) for p, sp in requests]
        return results, engine.stats()


def _together(engine: EmbeddedEngine, requests: list[tuple[list[int], SamplingParams]]):
    with engine:
        futures = [engine.submit(p, sp) for p, sp in requests]
        return [f.result(timeout=600) for f in futures], engine.stats()


def test_counting_changes_no_token(arith):
    model, prompts = arith
    greedy = [(p, SamplingParams(max_new_tokens=64, temperature=0.0)) for p in prompts[:16]]
    sampled = [
        (p, SamplingParams(max_new_tokens=64, temperature=1.0, seed=100 * i + a))
        for i, p in enumerate(prompts[:8])
        for a in range(4)
    ]
    for requests in (greedy, sampled):
        counted, st_on = _together(EmbeddedEngine(model, max_running=16, speculative=EVERY_STEP), requests)
        plain, st_off = _together(EmbeddedEngine(model, max_running=16, speculative=OFF), requests)
        assert [r.output_ids for r in counted] == [r.output_ids for r in plain]
        assert [r.output_logprobs for r in counted] == [r.output_logprobs for r in plain]
        assert sum(st_on["speculative_shadow"]["proposed"].values()) > 0
        assert "speculative_shadow" not in st_off and "speculative" not in st_off


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_request_at_a_time_counts_exactly_what_the_live_speculator_accepts(arith, temperature):
    """Requests in turn (the later repeat earlier prompts: `history` proposes too): the shadow's
    proposed and accepted tokens by source equal the live speculator's, for greedy and for seeded
    sampling (each position uses the request's own uniform, so the tokens are the same)."""
    model, prompts = arith
    requests = [
        (p, SamplingParams(max_new_tokens=64, temperature=temperature, seed=i))
        for i, p in enumerate(prompts[:10] + prompts[:4])
    ]
    spec = SpeculativeSettings(enabled=True)
    live, st_live = _one_at_a_time(_forced(EmbeddedEngine(model, seed=0, speculative=spec)), requests)
    shadow, st_shadow = _one_at_a_time(EmbeddedEngine(model, seed=0, speculative=EVERY_STEP), requests)
    assert [r.output_ids for r in live] == [r.output_ids for r in shadow]
    lv, sh = st_live["speculative"], st_shadow["speculative_shadow"]
    assert sh["proposed"] == lv["proposed"] and sh["accepted"] == lv["accepted"], (sh, lv)
    assert sum(sh["accepted"].values()) > 0 and sh["accepted"]["history"] > 0
    one = sh["by_rows"]["1"]
    assert sh["by_rows"].keys() == {"1"} and one["accepted"] / one["proposed"] == lv["acceptance_by_rows"]["1"]
    # tokens per row and verifying forward: the live steps that verified a proposal emitted 1 + accepted
    assert one["proposals"] == lv["steps"] and one["tokens_per_forward"] == pytest.approx(lv["tokens_per_forward"])


def test_groups_in_flight_agree_with_the_live_speculator_in_kind(arith):
    """Four seeded answers per prompt together: live steps emit several tokens per row, so the
    siblings are at other positions than under plain decoding and the counts are not the same
    token for token; the acceptance by source agrees within a few per cent."""
    model, prompts = arith
    requests = [
        (p, SamplingParams(max_new_tokens=64, temperature=1.0, seed=100 * i + a))
        for i, p in enumerate(prompts[:8])
        for a in range(4)
    ]
    _, st_live = _together(_forced(EmbeddedEngine(model, speculative=SpeculativeSettings(enabled=True))), requests)
    _, st_shadow = _together(EmbeddedEngine(model, speculative=EVERY_STEP), requests)
    lv, sh = st_live["speculative"], st_shadow["speculative_shadow"]
    assert sh["accepted"]["group"] > 0
    for source in ("prompt", "group"):
        rate = sh["accepted"][source] / sh["proposed"][source]
        assert rate == pytest.approx(lv["accepted"][source] / lv["proposed"][source], abs=0.1), (source, sh, lv)


def test_the_bookkeeping_stays_bounded_over_many_requests_aborts_and_updates():
    """Many prompts, small history bounds, aborted requests and weight updates mid-flight: once idle
    the counter holds nothing per request and the draft store holds at most its bounds."""
    model = build_spiky_qwen2(0, vocab_size=64)
    settings = SpeculativeSettings(shadow_every=1, history_prompts=4, history_answers=2)
    engine = EmbeddedEngine(model=model, max_running=8, speculative=settings)
    gen = torch.Generator().manual_seed(0)
    sizes = []
    with engine:
        for batch in range(12):
            prompts = [torch.randint(1, 64, (6,), generator=gen).tolist() for _ in range(3)]
            futures = [
                engine.submit(
                    p, SamplingParams(max_new_tokens=24, temperature=1.0, seed=batch * 10 + a, ignore_eos=True)
                )
                for p in prompts
                for a in range(3)
            ]
            if batch % 3 == 1:
                time.sleep(0.01)
                engine.update_weights_from_state_dict(model.state_dict(), engine.version + 1)
            if batch % 4 == 2:
                engine.abort_all()
            for f in futures:
                f.result(timeout=120)
            assert engine._shadow is not None
            sizes.append(engine._shadow.drafts.stats())
            assert engine._shadow.bookkeeping() == {"rows": 0, "groups": 0, "open": 0, "resume": 0}
        stats = engine.stats()["speculative_shadow"]
    assert all(s["prompts"] <= 4 and s["answers"] <= 4 * 2 and s["live"] == 0 for s in sizes), sizes
    assert sizes[-1]["occurrences"] <= max(s["occurrences"] for s in sizes[:6]) * 2  # no growth with requests
    assert stats["shadowed"] > 0 and sum(stats["proposed"].values()) > 0


def _check_counts(sh: dict) -> None:
    assert set(sh) == {"every", "shadowed", "dropped", "proposals", "proposed", "accepted", "by_rows"}
    assert set(sh["proposed"]) == set(SOURCES) == set(sh["accepted"]) == set(sh["proposals"])
    assert all(0 <= sh["accepted"][s] <= sh["proposed"][s] for s in SOURCES)
    assert sum(sh["proposals"].values()) == sum(b["proposals"] for b in sh["by_rows"].values())
    for key, b in sh["by_rows"].items():
        assert int(key) in (1, 2, 4, 8, 16, 32, 64)
        assert b["tries"] >= b["proposals"] > 0 and 0 <= b["accepted"] <= b["proposed"]
        reached, kept = b["reached"], b["accepted_at"]
        assert reached[0] == b["proposals"] and sum(kept) == b["accepted"]
        assert all(k <= r for k, r in zip(kept, reached)) and all(r2 <= k for k, r2 in zip(kept, reached[1:]))
        assert all(0.0 <= a <= 1.0 for a in b["acceptance_by_position"])
        assert b["tokens_per_forward"] == pytest.approx(1 + b["accepted"] / b["proposals"])


def test_the_counts_reach_the_stats_the_trace_records_and_the_trace_command(arith, tmp_path):
    from aiohttp.test_utils import TestClient, TestServer

    from areal_graph.engines.inference.server.http_server import InferenceHTTPServer

    model, prompts = arith
    engine = EmbeddedEngine(model, max_running=8, speculative=EVERY_STEP)
    server = InferenceHTTPServer(engine, name="inference-0")

    async def go():
        async with TestClient(TestServer(server.app)) as client:
            for i, p in enumerate(prompts[:6]):
                body = {"input_ids": p, "sampling_params": {"max_new_tokens": 48, "temperature": 1.0, "seed": i}}
                assert (await client.post("/generate", json=body)).status == 200
            return (await (await client.get("/get_spans")).json())["spans"]

    with engine:
        spans = asyncio.run(go())
        _check_counts(engine.stats()["speculative_shadow"])
    (record,) = [s for s in spans if s["name"] == "speculation_shadow"]
    assert not [s for s in spans if s["name"] == "speculation"]  # live speculation was off
    _check_counts(record["args"])
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "inference-0"}},
        {"name": "speculation_shadow", "cat": "profile", "ph": "X", "ts": 0, "dur": 0, "pid": 1, "tid": 1},
    ]
    events[1]["args"] = record["args"]
    (tmp_path / "trace.json").write_text(json.dumps(events))
    summary = shadow_summary(load_timeline(tmp_path))
    assert summary["available"] and summary["accepted"] == record["args"]["accepted"]
    assert summary["by_rows"]["1"]["tokens_per_forward"] == record["args"]["by_rows"]["1"]["tokens_per_forward"]
    (line,) = cmd_trace._shadow_lines(summary)
    accepted, proposed = sum(summary["accepted"].values()), sum(summary["proposed"].values())
    assert f"shadow speculation (off)[/]: would have accepted {accepted} of {proposed} proposed tokens" in line
    assert "at 1 row" in line and "by source" in line


def test_no_counts_when_turned_off_or_when_speculation_runs(arith, tmp_path):
    model, prompts = arith
    for settings in (OFF, SpeculativeSettings(enabled=True)):
        with EmbeddedEngine(model, speculative=settings) as engine:
            engine.submit(prompts[0], SamplingParams(max_new_tokens=8, temperature=0.0)).result(timeout=60)
            assert "speculative_shadow" not in engine.stats()
    with EmbeddedEngine(model) as engine:  # the default: counted, for one prompt in 16
        assert engine.stats()["speculative_shadow"]["every"] == 16
    events = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "inference-0"}}]
    (tmp_path / "trace.json").write_text(json.dumps(events))
    assert shadow_summary(load_timeline(tmp_path)) == {"available": False}
    assert cmd_trace._shadow_lines({"available": False}) == []


def test_a_failing_count_turns_itself_off_and_never_fails_generation(arith, monkeypatch, caplog):
    model, prompts = arith

    def broken(self, rows):
        raise RuntimeError("a bug in the counting")

    monkeypatch.setattr(ShadowSpeculation, "before_step", broken)
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    with EmbeddedEngine(model, speculative=EVERY_STEP) as engine:
        result = engine.submit(prompts[0], params).result(timeout=60)
        assert "speculative_shadow" not in engine.stats()
    with EmbeddedEngine(model, speculative=OFF) as engine:
        assert engine.submit(prompts[0], params).result(timeout=60).output_ids == result.output_ids
    assert "shadow speculation counting failed" in caplog.text
