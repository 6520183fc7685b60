"""`areal-graph init-model` (cli/cmd_init_model.py) in-process: a real install of the shipped
tiny-arith warm start into a temporary $AREAL_GRAPH_CACHE (about 2 s), reported with where it
went and what the kit's metadata says, then found cached, then printed as JSON; how --rebuild
and --from-recipe reach `ensure_kit` (with a stand-in, so nothing is built for minutes); an
unknown kit name listing the known ones; and the stage lines `kit_progress` prints."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

import areal_graph.modelkit.builtin as builtin
from areal_graph.cli import cmd_init_model
from support.cli import parser_of

parse = parser_of(cmd_init_model, "init-model")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path / "cache"))


def test_parser_defaults():
    args = parse()
    assert (args.name, args.rebuild, args.from_recipe, args.json) == ("tiny-arith", False, False, False)
    assert args.func is cmd_init_model.run
    assert parse("tiny-calc", "--rebuild", "--json").name == "tiny-calc"


def test_unknown_kit_lists_the_known_ones(capsys):
    assert cmd_init_model.run(parse("builtin:nope")) == 2
    known = [*builtin.BUILTIN_KITS, *builtin.BUILTIN_REWARD_MODELS]
    assert f"unknown builtin kit 'builtin:nope'; choose one of {', '.join(known)}" in capsys.readouterr().err


def test_a_builtin_reward_model_is_built_like_a_kit(tmp_path, capsys, monkeypatch):
    """tiny-arith-rm, which workflows, eval and serve accept, was an "unknown builtin kit" here;
    its build (~20 s) is a stand-in: tests/modelkit/test_reward_model.py builds one."""
    import areal_graph.modelkit.reward_model as reward_model

    asked = []

    def fake_ensure(recipe, root=None, progress=None):
        asked.append(recipe.name)
        (tmp_path / "rm").mkdir(exist_ok=True)
        (tmp_path / "rm" / "reward_model.json").write_text(json.dumps({"name": recipe.name}))
        return tmp_path / "rm"

    monkeypatch.setattr(reward_model, "ensure_reward_model", fake_ensure)
    assert cmd_init_model.run(parse("builtin:tiny-arith-rm")) == 0
    assert re.search(
        rf"^tiny-arith-rm \(reward model\) ready in \d+\.\d s at {re.escape(str(tmp_path / 'rm'))}$",
        capsys.readouterr().err,
        re.M,
    )
    assert cmd_init_model.run(parse("tiny-arith-rm", "--json")) == 0
    assert json.loads(capsys.readouterr().out) == {"name": "tiny-arith-rm"} and asked == ["tiny-arith-rm"] * 2
    assert cmd_init_model.run(parse("tiny-arith-rm", "--rebuild")) == 2
    assert "--rebuild / --from-recipe are for policy kits" in capsys.readouterr().err


def test_shipped_kit_installs_then_is_cached_then_prints_json(tmp_path, capsys):
    cfg = builtin.BUILTIN_KITS["tiny-arith"]
    path = builtin.kit_dir(cfg)
    assert path.parent == tmp_path / "cache" and builtin.load_kit(cfg) is None

    assert cmd_init_model.run(parse()) == 0
    err = capsys.readouterr().err
    info = json.loads((path / "kit.json").read_text())
    assert info["source"] == "shipped" and info["name"] == "tiny-arith"
    assert (path / "model" / "config.json").is_file()
    assert all((path / "data" / f"{split}.jsonl").stat().st_size > 0 for split in ("train", "test"))
    assert re.search(rf"^tiny-arith installed \(shipped\) in \d+\.\d s at {re.escape(str(path))}$", err, re.M), err
    assert (
        f"  model     {path / 'model'}  ({info['parameters'] / 1e6:.2f}M parameters, vocab {info['vocab_size']})"
    ) in err
    assert (
        f"  train     {path / 'data' / 'train.jsonl'}" in err and f"  test      {path / 'data' / 'test.jsonl'}" in err
    )
    assert (
        f"  warm start: greedy accuracy {info['warm_start_greedy_accuracy']:.1%} on {info['eval_prompts']} "
        "test problems"
    ) in err
    assert "installing the shipped tiny-arith warm start" in err  # a stage line from kit_progress

    assert cmd_init_model.run(parse("builtin:tiny-arith")) == 0  # the prefix is accepted
    assert re.search(rf"^tiny-arith cached in \d+\.\d s at {re.escape(str(path))}$", capsys.readouterr().err, re.M)

    assert cmd_init_model.run(parse("--json")) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == info and "cached" not in captured.err


class FakeKits:
    """Stands in for load_kit/ensure_kit: records how ensure_kit is asked."""

    def __init__(self, tmp_path, cached: bool, source: str = "recipe"):
        self.cached = cached
        self.calls: list[dict] = []
        self.kit = builtin.Kit(
            tmp_path / "kit",
            {
                "source": source,
                "parameters": 1_234_567,
                "vocab_size": 300,
                "warm_start_greedy_accuracy": 0.5,
                "eval_prompts": 10,
                "timings": {"total_s": 99.4},
                "built_on": "a test box",
            },
        )

    def load_kit(self, cfg, root=None):
        return self.kit if self.cached else None

    def ensure_kit(self, cfg, root=None, progress=None, rebuild=False, from_recipe=False):
        self.calls.append({"name": cfg.name, "rebuild": rebuild, "from_recipe": from_recipe})
        progress("stage one")
        return self.kit


@pytest.mark.parametrize(
    "flags,cached,asked,how",
    [
        ([], True, {"rebuild": False, "from_recipe": False}, "cached"),
        ([], False, {"rebuild": False, "from_recipe": False}, "built from the recipe"),
        (["--rebuild"], True, {"rebuild": True, "from_recipe": False}, "built from the recipe"),
        (["--from-recipe"], True, {"rebuild": True, "from_recipe": True}, "built from the recipe"),
    ],
)
def test_flags_reach_ensure_kit(monkeypatch, tmp_path, capsys, flags, cached, asked, how):
    fake = FakeKits(tmp_path, cached)
    monkeypatch.setattr(builtin, "load_kit", fake.load_kit)
    monkeypatch.setattr(builtin, "ensure_kit", fake.ensure_kit)
    assert cmd_init_model.run(parse("tiny-calc", *flags)) == 0
    assert fake.calls == [{"name": "tiny-calc", **asked}]
    err = capsys.readouterr().err
    assert re.search(rf"^tiny-calc {how} in \d+\.\d s at {re.escape(str(tmp_path / 'kit'))}$", err, re.M), err
    assert "(1.23M parameters, vocab 300)" in err
    assert "greedy accuracy 50.0% on 10 test problems; built in 99 s on a test box" in err
    assert re.search(r"^\d\d:\d\d:\d\d stage one$", err, re.M)


def test_kit_progress_prints_each_stage_with_the_time():
    buf = io.StringIO()
    with cmd_init_model.kit_progress(Console(file=buf, width=200)) as progress:
        progress("tokenizer")
        progress("model (0.83M parameters)")
        progress("cache /tmp/[run 1]/kit")  # text, not markup
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    assert len(lines) == 3
    assert re.fullmatch(r"\d\d:\d\d:\d\d tokenizer", lines[0])
    assert re.fullmatch(r"\d\d:\d\d:\d\d model \(0\.83M parameters\)", lines[1])
    assert re.fullmatch(r"\d\d:\d\d:\d\d cache /tmp/\[run 1\]/kit", lines[2])
