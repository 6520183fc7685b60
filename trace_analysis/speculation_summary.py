"""What speculative decoding did in a run, read off the inference servers' records.

Two records feed it (engines/inference/server/http_server.py `get_spans`): the engine's step
log (`engine_steps`, one row per forward; kind 2 is a verifying step, whose `rows` column counts
the rows it verified and whose eighth column `out` the tokens it emitted) and, while the engine
speculates, a `speculation` record with its running counts (proposed and accepted tokens by
source). Why both: tokens per forward and their dependence on the batch come from every step,
exactly; where the accepted tokens came from only the engine knows.

While the engine does not speculate it counts what speculation would have accepted
(engines/inference/speculation/shadow.py) and the server records those counts as a
`speculation_shadow` record: `shadow_summary` adds up each server's latest.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from areal_graph.trace_analysis.trace_model import Timeline

DECODE, VERIFY = (
    1,
    2,
)  # engines/inference/engine_spans.py STEP_DECODE, STEP_VERIFY (the analyser does not import the engine)
SOURCES = ("self", "prompt", "group", "history")


def _bucket(rows: int) -> int:
    b = 1
    while b < rows:
        b *= 2
    return b


def speculation_counters(tl: Timeline, window_us: float = 1e6) -> list[dict[str, Any]]:
    """Counter samples for the trace page, one a second per server that verified anything:
    tokens per row and verifying forward, and the share of the engine's forwards that verified
    (the page draws them as a `speculation` counter track under the server)."""
    out: list[dict[str, Any]] = []
    for s in tl.profiles:
        if s["name"] != "engine_steps":
            continue
        bins: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # forwards, verifying, rows, out
        for r in s["args"].get("steps", []):
            b = bins[int((s["ts"] + float(r[0])) // window_us)]
            b[0] += 1
            if len(r) > 7 and int(r[2]) == VERIFY:
                b[1], b[2], b[3] = b[1] + 1, b[2] + int(r[3]), b[3] + int(r[7])
        for k, (forwards, verifying, rows, emitted) in sorted(bins.items()):
            if verifying:
                values = {"tokens per row and forward": emitted / rows, "verifying share": verifying / forwards}
                out.append({"ts": k * window_us, "name": "speculation", "process": s["process"], "values": values})
    return out


def speculation_summary(tl: Timeline) -> dict[str, Any]:
    """Verifying steps and their share of the engine's forwards, tokens per row and forward
    overall and by batch size (powers of two), and the accepted share of proposed tokens by
    source (summed over servers, from each one's latest counts)."""
    forwards = verifying = decodes = 0
    rows_by: dict[int, int] = defaultdict(int)
    out_by: dict[int, int] = defaultdict(int)
    latest: dict[str, dict[str, Any]] = {}
    for s in tl.profiles:
        if s["name"] == "engine_steps":
            for r in s["args"].get("steps", []):
                forwards += 1
                decodes += int(r[2]) in (DECODE, VERIFY)
                if len(r) > 7 and int(r[2]) == VERIFY:
                    verifying += 1
                    rows_by[_bucket(int(r[3]))] += int(r[3])
                    out_by[_bucket(int(r[3]))] += int(r[7])
        elif s["name"] == "speculation" and isinstance(s["args"].get("proposed"), dict):
            latest[s["process"]] = s["args"]
    if not verifying:
        return {"available": False, "forwards": forwards}
    proposed = {k: sum(int(a["proposed"].get(k, 0)) for a in latest.values()) for k in SOURCES}
    accepted = {k: sum(int(a.get("accepted", {}).get(k, 0)) for a in latest.values()) for k in SOURCES}
    return {
        "available": True,
        "forwards": forwards,
        "verifying": verifying,
        "verifying_share": verifying / decodes,  # of the decode steps, plain and verifying (prefills aside)
        "tokens_per_forward": sum(out_by.values()) / sum(rows_by.values()),
        "by_rows": {str(b): out_by[b] / rows_by[b] for b in sorted(rows_by)},
        "proposed": proposed,
        "accepted": accepted,
        "acceptance": {k: (accepted[k] / proposed[k] if proposed[k] else None) for k in SOURCES},
    }


def shadow_summary(tl: Timeline) -> dict[str, Any]:
    """What speculation would have accepted in a run that did not speculate: proposed and accepted
    tokens by source, and by batch size (powers of two) proposals, the mean accepted per proposal,
    tokens per verifying forward (1 + that mean) and acceptance per position (accepted at position
    k of those that reached it), summed over servers from each one's latest counts."""
    latest: dict[str, dict[str, Any]] = {}
    for s in tl.profiles:
        if s["name"] == "speculation_shadow" and isinstance(s["args"].get("proposed"), dict):
            latest[s["process"]] = s["args"]
    proposed = {k: sum(int(a["proposed"].get(k, 0)) for a in latest.values()) for k in SOURCES}
    if not sum(proposed.values()):
        return {"available": False}
    accepted = {k: sum(int(a.get("accepted", {}).get(k, 0)) for a in latest.values()) for k in SOURCES}
    buckets: dict[int, dict[str, Any]] = {}
    for a in latest.values():
        for key, t in (a.get("by_rows") or {}).items():
            b = buckets.setdefault(int(key), {"proposals": 0, "accepted": 0, "reached": [], "accepted_at": []})
            b["proposals"] += int(t.get("proposals", 0))
            b["accepted"] += int(t.get("accepted", 0))
            for name in ("reached", "accepted_at"):
                add_positions(b[name], t.get(name, []))
    by_rows = {
        str(k): {
            "proposals": b["proposals"],
            "mean_accepted": b["accepted"] / b["proposals"],
            "tokens_per_forward": 1.0 + b["accepted"] / b["proposals"],
            "acceptance_by_position": [x / r if r else 0.0 for x, r in zip(b["accepted_at"], b["reached"])],
        }
        for k, b in sorted(buckets.items())
        if b["proposals"]
    }
    return {
        "available": True,
        "every": max(int(a.get("every", 0)) for a in latest.values()),
        "proposed": proposed,
        "accepted": accepted,
        "acceptance": {k: (accepted[k] / proposed[k] if proposed[k] else None) for k in SOURCES},
        "by_rows": by_rows,
    }


def add_positions(total: list[int], counts: Any) -> int:
    """Add per-position counts (reached, accepted at draft position 1, 2, ...) of one record into
    `total`, growing it as needed; returns the record's number of positions."""
    counts = [int(x) for x in counts]
    total.extend([0] * (len(counts) - len(total)))
    for i, x in enumerate(counts):
        total[i] += x
    return len(counts)
