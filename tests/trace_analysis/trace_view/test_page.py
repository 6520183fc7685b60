"""trace_analysis/trace_view/page.py: `build_page` fills page.html's markers with the
styles, the script, the escaped title, each run's graph section and summary tables and the
data block (whose `</` is escaped so no label or arg can end the script early); `write_page`
writes it where asked. A run without a workflow, or one whose graph cannot be drawn, still
gets its page, saying why the graph is missing.

test_trace_html.py checks the page as a browser sees it; these check what build_page itself
puts where, on the run fixtures and on small traces written here."""

from __future__ import annotations

import json
import logging
import re

import pytest

from areal_graph.trace_analysis.trace_run import load_run
from areal_graph.trace_analysis.trace_summary import summarize_run
from areal_graph.trace_analysis.trace_view import page as page_module
from areal_graph.trace_analysis.trace_view.page import build_page, write_page
from areal_graph.trace_analysis.trace_view.payload import PageOptions
from support.paths import FIXTURES

RUNS = FIXTURES / "trace_runs"
MARKERS = ("@TITLE@", "@GRAPHS@", "@SUMMARY@", "@DATA@", "/*@CSS@*/", "/*@JS@*/")


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def sync_run():
    return load_run(RUNS / "sync", "sync")


def test_every_marker_is_filled_and_the_assets_are_inline(sync_run):
    page = build_page([sync_run])
    assert not any(m in page for m in MARKERS)
    assert (page_module.ASSETS / "viewer.js").read_text() in page
    assert (page_module.ASSETS / "viewer.css").read_text() in page
    assert page.count("<title>timeline: sync</title>") == 1 and page.count("<h1>timeline: sync</h1>") == 1
    data = _data(page)
    assert [r["label"] for r in data["runs"]] == ["sync"] and re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", data["generated"]
    )


def test_a_label_cannot_break_out_of_the_title_or_the_data_block():
    label = 'x</script><b onclick="1">&'
    page = build_page([load_run(RUNS / "sync", label)])
    escaped = "x&lt;/script&gt;&lt;b onclick=&quot;1&quot;&gt;&amp;"
    assert f"<title>timeline: {escaped}</title>" in page and f"<h1>timeline: {escaped}</h1>" in page
    assert label not in page  # neither raw in the HTML nor in the JSON (whose "</" is written "<\/")
    assert page.count("</script>") == 2  # the data block's and the script's own
    assert _data(page)["runs"][0]["label"] == label


@pytest.mark.parametrize("label", ["run @DATA@", "@TITLE@ and @SUMMARY@", "/*@JS@*/"])
def test_a_label_that_looks_like_a_marker_stays_text(label):
    page = build_page([load_run(RUNS / "sync", label)])
    assert _data(page)["runs"][0]["label"] == label  # the data block is whole and holds the label


def test_two_runs_share_one_page_in_order_with_their_graphs_and_summaries(sync_run):
    page = build_page([sync_run, load_run(RUNS / "async", "async")])
    assert "<title>timeline: sync vs async</title>" in page
    assert [r["label"] for r in _data(page)["runs"]] == ["sync", "async"]
    sections = re.findall(r'<section class="graph" data-run="([^"]+)" data-nodes="([^"]+)"', page)
    assert [s[0] for s in sections] == ["sync", "async"]
    for _, nodes in sections:
        stats = json.loads(nodes.replace("&quot;", '"'))
        assert set(stats) == {"rollout", "reward", "prox_logp", "advantage", "train"}
        assert stats["prox_logp"]["fused_into"] == "train" and stats["train"]["fused_into"] is None
    assert "fused into train" in page  # the fused node's row says so instead of numbers
    assert re.findall(r"<section class='summary'><h3>([^<]+)</h3>", page) == ["sync", "async"]
    assert page.index('data-run="sync"') < page.index('data-run="async"')


def test_given_summaries_are_used_and_their_notes_reach_the_data(sync_run):
    summary = summarize_run(sync_run)
    summary["notes"] = ["a note from the caller"]
    summary["label"] = "relabelled in the summary"
    page = build_page([sync_run], summaries=[summary])
    assert _data(page)["runs"][0]["notes"] == ["a note from the caller"]
    assert "<h3>relabelled in the summary</h3>" in page


def test_a_bare_trace_has_no_graph_and_says_why(tmp_path):
    events = [
        {"name": "w", "cat": "compute", "ph": "X", "ts": k * 100.0, "dur": 50.0, "pid": 1, "tid": 1} for k in range(5)
    ]
    (tmp_path / "trace.json").write_text(json.dumps(events))
    page = build_page([load_run(tmp_path / "trace.json", "bare")])
    assert '<section class="graph" data-run="bare"><h3>bare</h3><p class="missing">no workflow graph' in page
    assert "<h4>staleness</h4><p class='missing'>no staleness recorded" in page
    assert "<h4>micro-batch packing</h4><p class='missing'>not available: " in page
    notes = _data(page)["runs"][0]["notes"]
    assert any("a bare trace file" in n for n in notes)


def test_a_graph_that_cannot_be_drawn_keeps_the_timeline(sync_run, monkeypatch, caplog):
    from areal_graph.graph import render

    def broken(spec):
        raise RuntimeError("no <svg> today")

    monkeypatch.setattr(render, "to_svg", broken)
    with caplog.at_level(logging.WARNING, logger=page_module.__name__):
        page = build_page([sync_run])
    assert '<p class="missing">the graph cannot be drawn: no &lt;svg&gt; today</p>' in page
    assert any("drawing the workflow graph of sync failed" in r.getMessage() for r in caplog.records)
    assert len(_data(page)["runs"][0]["spans"]["t"]) > 100


def test_thinned_flows_are_noted_on_the_page(tmp_path):
    events = []
    for k in range(150):
        events += [
            {"name": "a", "cat": "compute", "ph": "X", "ts": k * 100.0, "dur": 50.0, "pid": 1, "tid": 1},
            {"name": "b", "cat": "compute", "ph": "X", "ts": k * 100.0 + 60, "dur": 30.0, "pid": 1, "tid": 2},
            {"ph": "s", "id": k, "name": "f", "cat": "flow", "ts": k * 100.0 + 10, "pid": 1, "tid": 1},
            {"ph": "f", "bp": "e", "id": k, "name": "f", "cat": "flow", "ts": k * 100.0 + 70, "pid": 1, "tid": 2},
        ]
    (tmp_path / "trace.json").write_text(json.dumps(events))
    run = load_run(tmp_path / "trace.json")
    notes = _data(build_page([run], PageOptions(flow_budget=100)))["runs"][0]["notes"]
    assert "150 flow arrows: every 1.5th drawn (100)" in notes
    assert not any("flow arrows" in n for n in _data(build_page([run]))["runs"][0]["notes"])


def test_the_staleness_table_of_a_run_that_records_it(sync_run):
    summary = summarize_run(sync_run)
    st = summary["staleness"]
    assert st["counts"]
    html = page_module._staleness_html(st)
    assert html.count("<tr>") == len(st["counts"])
    assert f"<p>mean {st['mean']:.2f}, max {st['max']:g}</p>" in html
    assert "width:120px" in html and all(f"<td>{v}</td>" in html for v in st["counts"].values())
    two = page_module._staleness_html({**st, "counts": {0: 4, 1.5: 2}, "note": "a <note>"})
    assert "<tr><td>0</td><td><div class='bar' style='width:120px'></div></td><td>4</td></tr>" in two
    assert "<tr><td>1.5</td><td><div class='bar' style='width:60px'></div></td><td>2</td></tr>" in two
    assert "<p class='hint'>a &lt;note&gt;</p>" in two


def test_percentages_and_missing_values():
    assert page_module._pct(None) == "–" and page_module._pct(0.1234) == "12.3%" and page_module._pct(1) == "100.0%"


def test_write_page_makes_the_directory_and_writes_the_page(sync_run, tmp_path):
    path = write_page(tmp_path / "a" / "b" / "t.html", [sync_run])
    assert path == tmp_path / "a" / "b" / "t.html"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and _data(text)["runs"][0]["label"] == "sync"


def test_no_runs_is_an_error():
    with pytest.raises(ValueError, match="no runs"):
        build_page([])
