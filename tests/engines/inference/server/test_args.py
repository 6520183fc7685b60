"""The embedded server's `--speculative*` flags (engines/inference/server/args.py): what they parse
into (the engine's SpeculativeSettings), the ranges the parser refuses with the flag named, the
flags a workflow's `inference.speculative` becomes, and that the workflow section and the engine's
settings have the same fields and defaults (graph/ and engines/ may not import each other)."""

from __future__ import annotations

import dataclasses

import pytest

from areal_graph.engines.inference.server.args import build_arg_parser, speculative_flags, speculative_settings
from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings, Speculator
from areal_graph.graph.spec import SpeculativeSpec


def parse(*flags: str):
    return build_arg_parser().parse_args(["--model", "m", *flags])


def test_off_by_default_with_the_engines_defaults():
    assert speculative_settings(parse()) == SpeculativeSettings()
    assert speculative_settings(parse()).enabled is False


def test_every_flag_reaches_the_settings():
    args = parse(
        "--speculative",
        "on",
        "--speculative-max-draft",
        "16",
        "--speculative-max-rows",
        "8",
        "--speculative-min-match",
        "1",
        "--speculative-max-match",
        "6",
        "--speculative-history-prompts",
        "1",
        "--speculative-history-answers",
        "0",
    )
    settings = speculative_settings(args)
    assert settings == SpeculativeSettings(
        enabled=True, max_draft=16, max_rows=8, min_match=1, max_match=6, history_prompts=1, history_answers=0
    )
    Speculator(settings)  # the edges of every range are ones the engine's speculator takes


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--speculative", "yes", "argument --speculative: invalid choice: 'yes' (choose from on, off)"),
        ("--speculative-max-draft", "0", "argument --speculative-max-draft: must be in [1, 16], got 0"),
        ("--speculative-max-draft", "17", "argument --speculative-max-draft: must be in [1, 16], got 17"),
        ("--speculative-max-draft", "two", "argument --speculative-max-draft: expected an integer, got 'two'"),
        ("--speculative-max-rows", "0", "argument --speculative-max-rows: must be >= 1, got 0"),
        ("--speculative-min-match", "0", "argument --speculative-min-match: must be >= 1, got 0"),
        ("--speculative-history-prompts", "0", "argument --speculative-history-prompts: must be >= 1, got 0"),
        ("--speculative-history-answers", "-1", "argument --speculative-history-answers: must be >= 0, got -1"),
        ("--speculative-shadow-every", "-1", "argument --speculative-shadow-every: must be >= 0, got -1"),
    ],
)
def test_a_value_out_of_range_is_a_usage_error_naming_the_flag(flag, value, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse(flag, value)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err.replace("'on', 'off'", "on, off"), err  # argparse quotes choices from 3.12 on


def test_max_match_below_min_match_is_refused_with_both_flags():
    args = parse("--speculative", "on", "--speculative-min-match", "3", "--speculative-max-match", "2")
    with pytest.raises(ValueError, match=r"--speculative-max-match \(2\) must be >= --speculative-min-match \(3\)"):
        speculative_settings(args)


def test_the_workflow_section_becomes_flags_that_read_back_the_same():
    assert speculative_flags(SpeculativeSpec()) == []  # off: no flag at all
    # off, the drafting settings still reach the engine: it counts what they would have accepted
    assert speculative_flags(SpeculativeSpec(max_draft=8)) == ["--speculative-max-draft", "8"]
    assert speculative_flags(SpeculativeSpec(shadow_every=0)) == ["--speculative-shadow-every", "0"]
    assert speculative_settings(parse("--speculative-shadow-every", "0")) == SpeculativeSettings(shadow_every=0)
    assert speculative_flags(SpeculativeSpec(enabled=True)) == ["--speculative", "on"]  # defaults stay implicit
    section = SpeculativeSpec(enabled=True, max_draft=8, max_rows=32, history_answers=0)
    flags = speculative_flags(section)
    assert flags == [
        "--speculative",
        "on",
        "--speculative-max-draft",
        "8",
        "--speculative-max-rows",
        "32",
        "--speculative-history-answers",
        "0",
    ]
    assert speculative_settings(parse(*flags)) == SpeculativeSettings(**dataclasses.asdict(section))


def test_workflow_section_and_engine_settings_agree_field_by_field():
    spec_fields = {f.name: f.default for f in dataclasses.fields(SpeculativeSpec)}
    engine_fields = {f.name: f.default for f in dataclasses.fields(SpeculativeSettings)}
    assert spec_fields == engine_fields
