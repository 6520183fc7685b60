"""Constrained decoding (`constrained.py`, `structured_output.py`) in the real embedded engine.

The independent references: the tokens a mask lets through are checked by brute force (every
token tried on a copy of the matcher), JSON answers with `jsonschema`, and the reported
log-probs against a float64 transformers forward under the replayed mask.
"""

from __future__ import annotations

import json

import pytest
import torch

from areal_graph.api.tool_calls import parse_tool_calls, render_tool_call
from areal_graph.engines.inference.constrained import ConstraintCompiler, ConstraintError, apply_masks
from areal_graph.engines.inference.engine import EmbeddedEngine, InvalidRequestError, SamplingParams
from areal_graph.engines.openai.structured_output import JSON_LAYOUT, added_token_texts, output_constraint
from support.openai_tool_model import ADD_QUESTION, ADD_TOOL, HELLO_QUESTION, build_tool_model, ids, user_prompt

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["word", "n", "ok"],
    "properties": {
        "word": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
}
ADD_CLOSED = {
    "type": "function",
    "function": {
        **ADD_TOOL["function"],
        "parameters": {**ADD_TOOL["function"]["parameters"], "additionalProperties": False},
    },
}  # else any extra key may ramble on
MUL_TOOL = {
    "type": "function",
    "function": {
        "name": "mul",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}},
            "required": ["x"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tool_model(str(tmp_path_factory.getbasetemp() / "openai_tool_model"))[0]


@pytest.fixture(scope="module")
def engine(model_dir):
    torch.set_num_threads(1)
    with EmbeddedEngine(model_dir, max_running=16, seed=0) as eng:
        yield eng


def compact(schema: dict) -> str:
    return json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def brute_force_allowed(constraint, n_vocab: int) -> torch.Tensor:
    """The tokens a copy of the matcher accepts, tried one by one (independent of the bitmask path)."""
    out = torch.zeros(n_vocab, dtype=torch.bool)
    for t in range(n_vocab):
        probe = constraint._matcher.deep_copy()
        out[t] = bool(probe.try_consume_tokens([t]) == 1)
    return out


def test_the_mask_allows_only_tokens_the_grammar_accepts_and_every_token_of_a_valid_answer(engine):
    """Sound: every token the mask lets through is accepted by the grammar (brute force). Not
    a superset of the answer's tokens only: where the grammar forces text, llguidance allows the
    tokenizer's own split of it, not every split (a '{' when '{"' would be the token)."""
    tok = engine.tokenizer
    constraint = engine._constraints.compile(json_schema=compact(SCHEMA))
    text_ids = ids(tok, '{"word": "hi", "n": 42, "ok": true, "tags": ["b"]}')
    eos = list(engine.eos_token_ids)
    for k, t in enumerate(text_ids):  # at every position of a valid answer
        mask = constraint.allowed()
        reference = brute_force_allowed(constraint, constraint.n_vocab)
        reference[eos] = True  # EOS is the matcher's own rule, not a byte string
        assert not (mask & ~reference).any(), f"position {k}: a token the grammar refuses is allowed"
        assert mask[t], f"the valid answer's token {k} is masked"
        assert not mask[eos].any(), "EOS before the object is complete"
        constraint.advance(t)
    assert constraint.finished
    free = engine._constraints.compile(
        json_schema=compact(
            {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
                "additionalProperties": False,
            }
        )
    )
    for t in ids(tok, '{"word": "'):
        free.advance(t)
    assert int(free.allowed().sum()) > 100  # inside a free string most of the vocabulary may come next


def test_apply_masks_sets_forbidden_logits_to_minus_inf_and_leaves_other_rows(engine):
    c = engine._constraints.compile(json_schema=compact({"type": "boolean"}))
    logits = torch.randn(3, engine.vocab_size)
    out, forced = apply_masks(logits, [None, c, None])
    allowed = c.allowed()[: engine.vocab_size]
    assert forced == [None, False, None]
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert torch.equal(out[1][allowed], logits[1][allowed])
    assert torch.isinf(out[1][~allowed]).all() and int(allowed.sum()) >= 2  # "t..." and "f..."
    assert apply_masks(logits, [None, None, None]) == (logits, [None, None, None])
    one = engine._constraints.compile(json_schema=compact({"const": "x"}))
    assert apply_masks(logits, [one, None, None])[1] == [True, None, None]  # '"x"' has one split: forced


@pytest.mark.parametrize("seed", range(6))
def test_sampled_answers_are_valid_json_for_the_schema_whatever_the_seed(engine, seed):
    prompt = ids(engine.tokenizer, user_prompt(HELLO_QUESTION))
    res = engine.submit(
        prompt, SamplingParams(max_new_tokens=120, temperature=1.0, seed=seed, json_schema=compact(SCHEMA))
    ).result(timeout=60)
    text = engine.tokenizer.decode(res.output_ids, skip_special_tokens=True)
    assert res.finish_reason == "stop", text
    jsonschema.validate(json.loads(text), SCHEMA)


def test_reported_logprobs_are_those_of_the_masked_distribution(engine, model_dir):
    """float64 transformers forward, the grammar's mask replayed, temperature: the token's log-prob as drawn."""
    from transformers import AutoModelForCausalLM

    prompt = ids(engine.tokenizer, user_prompt(HELLO_QUESTION))
    temp = 0.7
    res = engine.submit(
        prompt, SamplingParams(max_new_tokens=40, temperature=temp, seed=3, json_schema=compact(SCHEMA))
    ).result(timeout=60)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + res.output_ids])).logits[0, len(prompt) - 1 : -1]
    replay = engine._constraints.compile(json_schema=compact(SCHEMA))
    forced = 0
    for k, t in enumerate(res.output_ids):
        allowed = replay.allowed()[: logits.shape[1]]  # the mask itself is checked against brute force above
        ref = torch.log_softmax(logits[k].masked_fill(~allowed, float("-inf")) / temp, -1)[t]
        assert abs(res.output_logprobs[k] - float(ref)) < 1e-4, k
        forced += int(allowed.sum()) == 1
        assert res.output_forced[k] == (int(allowed.sum()) == 1), k
        if t not in engine.eos_token_ids:
            replay.advance(t)
    assert forced >= 3  # '{"word": "' is forced: those tokens report log-prob 0
    assert all(lp == 0.0 for lp in res.output_logprobs[:2])


def test_a_forced_call_is_the_one_the_model_knows_and_a_required_one_is_valid_on_any_question(engine):
    tok = engine.tokenizer
    named = output_constraint(
        [ADD_TOOL, MUL_TOOL], {"type": "function", "function": {"name": "add"}}, True, None, added_token_texts(tok)
    )
    res = engine.submit(
        ids(tok, user_prompt(ADD_QUESTION)), SamplingParams(max_new_tokens=60, greedy=True, grammar=named.grammar)
    ).result(timeout=60)
    text = tok.decode(res.output_ids, skip_special_tokens=True)
    assert text == render_tool_call("add", {"a": 2, "b": 3})  # the constraint leaves a conforming answer alone
    required = output_constraint([ADD_CLOSED, MUL_TOOL], "required", False, None, added_token_texts(tok))
    for seed in range(4):  # the model would say hello: the grammar makes it a call, with valid arguments
        res = engine.submit(
            ids(tok, user_prompt(HELLO_QUESTION)),
            SamplingParams(max_new_tokens=80, temperature=1.0, seed=seed, grammar=required.grammar),
        ).result(timeout=60)
        text = tok.decode(res.output_ids, skip_special_tokens=True)
        calls = parse_tool_calls(text)
        assert res.finish_reason == "stop" and len(calls) == 1 and calls[0].error is None, text
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in (ADD_CLOSED, MUL_TOOL)}
        jsonschema.validate(calls[0].arguments, schema[calls[0].name])


def test_json_or_calls_beside_tools_and_parallel_calls(engine):
    """response_format with tools and tool_choice auto: either the JSON answer or calls."""
    tok = engine.tokenizer
    either = output_constraint(
        [MUL_TOOL],
        "auto",
        True,
        {"type": "json_schema", "json_schema": {"schema": {"type": "boolean"}}},
        added_token_texts(tok),
    )
    compiler = engine._constraints
    for text, ok in [
        ("true", True),
        (render_tool_call("mul", {"x": 3}), True),
        (render_tool_call("mul", {"x": 3}) + "\n" + render_tool_call("mul", {"x": -2}), True),
        ('"yes"', False),
        (render_tool_call("mul", {"x": 30}), False),
        (render_tool_call("add", {"a": 1, "b": 2}), False),
    ]:
        c = compiler.compile(grammar=either.grammar)
        consumed = c._matcher.try_consume_tokens(ids(tok, text))
        assert (consumed == len(ids(tok, text)) and c._matcher.is_accepting()) == ok, text
    single = output_constraint([MUL_TOOL], "required", False, None, added_token_texts(tok))
    c = compiler.compile(grammar=single.grammar)
    two = ids(tok, render_tool_call("mul", {"x": 3}) + "\n" + render_tool_call("mul", {"x": 4}))
    assert c._matcher.try_consume_tokens(two) < len(two)  # parallel_tool_calls false: one call


def test_a_bad_schema_or_grammar_is_refused_at_submit_in_bounded_time(engine):
    prompt = ids(engine.tokenizer, user_prompt(HELLO_QUESTION))
    deep_ll = '{"type": "object", "properties": {"a": ' * 300 + "{}" + "}}" * 300  # past llguidance's limit
    deep_py = '{"properties": {"a": ' * 5000 + "{}" + "}}" * 5000  # past Python's json recursion limit
    for params, fragment in [
        (SamplingParams(json_schema='{"type": "bogus"}'), "Invalid type"),
        (SamplingParams(json_schema="{not json"), "not valid JSON"),
        (SamplingParams(json_schema="[1]"), "must be a JSON object"),
        (SamplingParams(grammar="start: nope"), "unknown name"),
        (SamplingParams(json_schema=deep_ll), "recursion"),
        (SamplingParams(json_schema=deep_py), "nested too deeply"),
    ]:
        with pytest.raises(InvalidRequestError, match=fragment):
            engine.submit(prompt, params)
        assert engine.check_constraint(params) is not None
    assert SamplingParams(json_schema="{}", grammar="start: x").problems()
    assert SamplingParams(json_schema="{}", ignore_eos=True).problems()


def test_a_constraint_survives_a_weight_swap_mid_answer(model_dir, tmp_path):
    """Interruptible generation: the re-prefill after a swap continues the grammar where it was."""
    import time

    other = build_tool_model(str(tmp_path.parent / "openai_tool_model"))[1]
    with EmbeddedEngine(model_dir, max_running=4, seed=0) as eng:
        prompt = ids(eng.tokenizer, user_prompt(HELLO_QUESTION))
        params = SamplingParams(max_new_tokens=120, temperature=1.0, seed=5, json_schema=compact(SCHEMA))
        req, fut = eng._submit(prompt, params, None, 0)
        while len(req.output_ids) < 4 and not fut.done():
            time.sleep(0.001)
        eng.update_weights_from_disk(other, version=1)
        res = fut.result(timeout=60)
    text = eng.tokenizer.decode(res.output_ids, skip_special_tokens=True)
    assert res.output_versions[0] == 0 and res.output_versions[-1] == 1  # the swap fell inside the answer
    jsonschema.validate(json.loads(text), SCHEMA)


def test_a_tokenizerless_engine_cannot_constrain():
    with pytest.raises(ConstraintError, match="no tokenizer"):
        ConstraintCompiler(None, 10, [0]).compile(json_schema="{}")


@pytest.mark.parametrize("tag_is_a_token", [True, False])
def test_strict_tools_with_auto_take_text_or_valid_calls_and_text_then_calls_where_the_tag_is_a_token(
    engine, tag_is_a_token
):
    """The OpenAI Agents SDK's default (strict function tools, tool_choice auto). Text before a
    call fits one grammar only where the open tag is a token of its own (the tool model's, like
    Qwen2.5's); spelled in bytes (the arithmetic kit's tokenizer) it is text or calls."""
    from transformers import AutoTokenizer

    from areal_graph.modelkit.builtin import resolve_model_path

    tok = (
        engine.tokenizer if tag_is_a_token else AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-arith"))
    )
    strict = {"type": "function", "function": {**ADD_CLOSED["function"], "strict": True}}
    grammar = output_constraint([strict], "auto", True, None, added_token_texts(tok)).grammar
    compiler = ConstraintCompiler(tok, len(tok), [tok.eos_token_id])
    good, bad = render_tool_call("add", {"a": 2, "b": 3}), render_tool_call("add", {"a": "x", "b": 3})
    for text, ok in [
        ("Hello there", True),
        (good, True),
        (bad, False),
        ("Sure. " + good, tag_is_a_token),
        ("Sure. " + bad, False),
        (good + " and more", False),
    ]:
        matcher = compiler.compile(grammar=grammar)._matcher
        token_ids = ids(tok, text)
        assert (matcher.try_consume_tokens(token_ids) == len(token_ids) and matcher.is_accepting()) == ok, text
