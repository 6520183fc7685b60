"""Consoles of the commands: wide tables when piped, COLUMNS still decides."""

from __future__ import annotations

from areal_graph.cli.console import PIPED_WIDTH, output_console


def test_piped_output_is_wide_unless_columns_says_otherwise(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output_console(force_terminal=False).width == PIPED_WIDTH
    monkeypatch.setenv("COLUMNS", "100")
    assert output_console(force_terminal=False).width == 100


def test_a_validate_table_is_not_cut_in_a_ci_log(monkeypatch, capsys):
    from areal_graph.cli.main import main
    from support.paths import WORKFLOWS

    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["validate", str(WORKFLOWS / "ppo_async.yaml")]) == 0
    out = capsys.readouterr().out
    assert "generation" in out and "generati…" not in out
