"""The offline timeline page: self-contained, within its span budget, and drawn by a real browser.

The browser tests load the page in headless Debian chromium (CI: `apt-get install -y chromium`)
and read what the page's script wrote into <body data-...> after drawing; one of them drives
the page over the DevTools protocol (wheel zoom, drag pan, hover card). They are skipped, with
the reason, where no chromium is installed.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from areal_graph.trace_analysis.trace_run import load_run
from areal_graph.trace_analysis.trace_view import PageOptions, build_page, write_page
from support.ci import missing
from support.paths import FIXTURES

FIXTURES = FIXTURES / "trace_runs"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.fixture
def needs_chromium() -> None:
    if CHROMIUM is None:
        missing("chromium", "apt-get install -y chromium; .ci/run does it")


BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1600,1100", "--hide-scrollbars"]


def _payload(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert m, "the page has no data block"
    return json.loads(m.group(1), parse_constant=lambda c: pytest.fail(f"{c} in the page's JSON"))


def _compare_page(tmp_path: Path) -> Path:
    runs = [load_run(FIXTURES / "sync", "grpo_sync"), load_run(FIXTURES / "async", "ppo_async")]
    return write_page(tmp_path / "compare.html", runs)


def test_the_page_is_one_self_contained_file(tmp_path):
    page = _compare_page(tmp_path).read_text()
    # nothing is fetched: no external scripts, styles, images or fonts; the only URLs are SVG namespaces
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)\s*=", page, re.I)
    assert not re.search(r"@import|url\((?!#)", page)  # url(#arrow): a marker inside the SVG itself
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) <= {"http://www.w3.org/2000/svg"}
    data = _payload(page)
    assert [r["label"] for r in data["runs"]] == ["grpo_sync", "ppo_async"]
    for run in data["runs"]:
        names = {(t["process"], t["name"]) for t in run["tracks"]}
        assert {("controller", "step"), ("controller", "step bounded by"), ("model-actor", "train")} <= names
        assert len(run["flows"]) == run["flows_total"] > 0
        assert len(run["spans"]["t"]) == run["spans_total"] and not run["aggregation"]["applied"]
        rows = sum(t["rows"] for t in run["tracks"])
        assert all(0 <= r < rows for r in run["spans"]["r"])
        assert all(0 <= f[1] < rows and 0 <= f[3] < rows and f[2] >= f[0] for f in run["flows"])
    assert page.count('<g class="node"') == 10  # both workflows' graphs, 5 nodes each


def test_past_the_span_budget_short_spans_are_merged_and_the_page_says_so(tmp_path):
    events = [
        {"name": f"tiny{k}", "cat": "compute", "ph": "X", "ts": k * 100.0, "dur": 50.0, "pid": 1, "tid": 1}
        for k in range(3000)
    ]
    events += [
        {"name": "long", "cat": "compute", "ph": "X", "ts": 0.0, "dur": 250_000.0, "pid": 1, "tid": 2},
        {"name": "long2", "cat": "node", "ph": "X", "ts": 100_000.0, "dur": 5_000.0, "pid": 1, "tid": 1},
        {"ph": "s", "id": 1, "name": "f", "cat": "flow", "ts": 125.0, "pid": 1, "tid": 1},
        {"ph": "f", "bp": "e", "id": 1, "name": "f", "cat": "flow", "ts": 200_000.0, "pid": 1, "tid": 2},
    ]
    (tmp_path / "trace.json").write_text(json.dumps(events))
    page = build_page([load_run(tmp_path / "trace.json")], PageOptions(span_budget=500))
    run = _payload(page)["runs"][0]
    agg, spans = run["aggregation"], run["spans"]
    assert agg["applied"] and agg["spans_in"] == 3002 and len(spans["t"]) == agg["spans_out"] <= 500
    names = [run["names"][n] for n in spans["n"]]
    assert "long" in names and "long2" in names  # spans longer than the quantum are drawn as they are
    blocks = [run["args"][a] for a, f in zip(spans["a"], spans["f"]) if f & 2]
    # the 50 tiny spans nested in "long2" sit on a row of their own, too sparse to need merging
    assert sum(b["merged_spans"] for b in blocks) == agg["merged"] == 2950
    assert sum(1 for n in names if n.startswith("tiny")) == 50
    assert len(spans["t"]) == 3002 - 2950 + len(blocks)
    assert sum(b["busy_ms"] for b in blocks) == pytest.approx(2950 * 0.05)
    [flow] = run["flows"]
    assert run["args"][spans["a"][flow[4]]].get("merged_spans") and names[flow[5]] == "long"
    assert "more than the page's budget of 500" in " ".join(run["notes"])


def test_args_that_json_cannot_carry_to_a_browser_become_strings(tmp_path):
    events = [
        {
            "name": "s",
            "ph": "X",
            "ts": 0,
            "dur": 5,
            "pid": 1,
            "tid": 1,
            "args": {"loss": float("nan"), "v": [float("inf"), 1.5]},
        }
    ]
    (tmp_path / "trace.json").write_text(json.dumps(events))  # Python writes NaN / Infinity, JSON.parse rejects them
    run = _payload(build_page([load_run(tmp_path / "trace.json")]))["runs"][0]
    assert run["args"][run["spans"]["a"][0]] == {"loss": "nan", "v": ["inf", 1.5]}


def test_page_options_are_checked():
    with pytest.raises(ValueError, match="span_budget must be an integer >= 100, got 5"):
        PageOptions(span_budget=5)


# ---------------------------------------------------------------------- in a real browser
def _dump_dom(page: Path) -> tuple[str, str]:
    proc = subprocess.run(
        [
            CHROMIUM,
            *BROWSER_FLAGS,
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


class _Body(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.errors: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        if tag == "body":
            self.body = dict(attrs)
        elif dict(attrs).get("id") == "errors":
            self.errors = dict(attrs)


def _drawn(dom: str) -> _Body:
    parsed = _Body()
    parsed.feed(dom)
    return parsed


def _console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln and re.search(r"error|uncaught", ln, re.I)]


@pytest.mark.usefixtures("needs_chromium")
def test_chromium_draws_the_sync_vs_async_page_without_errors(tmp_path):
    dom, log = _dump_dom(_compare_page(tmp_path))
    got = _drawn(dom)
    assert got.body["data-status"] == "ok", dom[dom.find('id="errors"') :][:2000]
    assert got.errors["data-count"] == "0" and not _console_errors(log)
    data = _payload((tmp_path / "compare.html").read_text())
    assert got.body["data-runs"] == "2"
    assert int(got.body["data-tracks"]) == sum(len(r["tracks"]) for r in data["runs"])
    assert int(got.body["data-lanes"]) == sum(t["rows"] for r in data["runs"] for t in r["tracks"])
    assert int(got.body["data-spans-drawn"]) > 100
    assert (
        0
        < int(got.body["data-flows-drawn"])
        <= int(got.body["data-flows-total"])
        == sum(len(r["flows"]) for r in data["runs"])
    )
    assert got.body["data-graph-nodes"] == "10"
    assert dom.count('class="node-time"') == 10 and "% busy" in dom


@pytest.mark.usefixtures("needs_chromium")
def test_chromium_draws_a_damaged_trace_and_lists_what_is_missing(tmp_path):
    run = tmp_path / "killed"
    shutil.copytree(FIXTURES / "async", run)
    text = (run / "trace.json").read_text()
    cut = text.index('"name":"actor.train"', len(text) // 2) + 10  # mid-event, metadata tail lost
    (run / "trace.json").write_text(text[:cut])
    (run / "unfinished.json").unlink()
    page = write_page(tmp_path / "killed.html", [load_run(run)])
    dom, log = _dump_dom(page)
    got = _drawn(dom)
    assert got.body["data-status"] == "ok" and got.errors["data-count"] == "0" and not _console_errors(log)
    assert int(got.body["data-notes"]) >= 3 and int(got.body["data-spans-drawn"]) > 50
    for phrase in (
        "cut off mid-write",
        "unparsable bytes skipped",
        "recovered from the span args",
        "did not stop cleanly",
    ):
        assert phrase in dom


# ---------------------------------------------------------------------- driving the page (DevTools protocol)
class _Page:
    """One chromium page over the DevTools protocol (aiohttp's websocket client)."""

    def __init__(self, ws) -> None:
        self.ws, self.n = ws, 0

    async def call(self, method: str, **params):
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=30)
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg.get("result", {})

    async def js(self, expr: str):
        res = await self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return res["result"].get("value")

    async def mouse(self, kind: str, x: float, y: float, **extra):
        await self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)


async def _drive(url: str, proc: subprocess.Popen) -> dict:
    import aiohttp

    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        port = int(m.group(1)) if m else None
    assert port, "chromium did not start its DevTools endpoint"
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?{url}") as resp:
            target = await resp.json(content_type=None)
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = _Page(ws)
            for _ in range(100):
                if await page.js("document.body && document.body.dataset.status") in ("ok", "error"):
                    break
                await asyncio.sleep(0.1)
            box = await page.js(
                "(function(){var r=document.getElementById('timeline').getBoundingClientRect();"
                "return [r.left, r.top, r.width, r.height];})()"
            )
            view = "[Number(document.body.dataset.viewStart), Number(document.body.dataset.viewEnd)]"
            out = {"status": await page.js("document.body.dataset.status"), "before": await page.js(view)}
            cx, cy = box[0] + box[2] * 0.6, box[1] + box[3] * 0.4
            await page.mouse("mouseWheel", cx, cy, deltaX=0, deltaY=-600)
            out["zoomed"] = await page.js(view)
            await page.mouse("mousePressed", cx, cy, button="left", clickCount=1)
            await page.mouse("mouseMoved", cx - 200, cy, button="left")
            await page.mouse("mouseReleased", cx - 200, cy, button="left", clickCount=1)
            out["panned"] = await page.js(view)
            await page.call("Input.dispatchKeyEvent", type="keyDown", key="0")  # no-op key: nothing changes
            await page.js("document.getElementById('reset').click()")
            spot = await page.js("window.arealTimeline.locate('grpo_sync', 'train')")  # the upper run: in view
            assert 0 < spot["y"] < box[3], (spot, box)
            await page.mouse("mouseMoved", box[0] + spot["x"], box[1] + spot["y"])
            out["card"] = await page.js(
                "(function(){var c=document.getElementById('card');return c.hidden ? null : c.textContent;})()"
            )
            out["errors"] = await page.js("document.getElementById('errors').dataset.count")
    return out


@pytest.mark.usefixtures("needs_chromium")
def test_wheel_zooms_drag_pans_and_hover_shows_a_span_card(tmp_path):
    page = _compare_page(tmp_path)
    proc = subprocess.Popen(
        [CHROMIUM, *BROWSER_FLAGS, "--remote-debugging-port=0", "about:blank"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        out = asyncio.run(asyncio.wait_for(_drive(page.resolve().as_uri(), proc), timeout=120))
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert out["status"] == "ok" and out["errors"] == "0"
    (a0, b0), (a1, b1), (a2, b2) = out["before"], out["zoomed"], out["panned"]
    assert (b1 - a1) < 0.5 * (b0 - a0)  # the wheel zoomed in around the cursor
    assert a0 < a1 and b1 < b0
    assert a2 > a1 and (b2 - a2) == pytest.approx(b1 - a1, rel=1e-3)  # dragging left moved later time into view
    card = out["card"]
    assert card and card.startswith("train") and "model-actor › train" in card and "flow_in" in card
