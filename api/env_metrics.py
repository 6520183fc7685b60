"""An environment's own per-episode numbers as run metrics: `Trajectory.info["metrics"]`.

Why: a multi-turn environment knows things the reward does not say (turns taken, solved on the
first try, invalid moves). A rollout class puts them in `info["metrics"]` (a flat mapping of
name -> number or bool); each step logs their mean over the trajectories it trained as
`env/<name>`, and each evaluation as `eval/env/<name>`, beside reward and accuracy (metrics.jsonl,
TensorBoard, `areal-graph trace`). A name keeps letters, digits, '_', '.' and '-' (anything else
becomes '_'), so a key stays one level deep; at most MAX_ENV_METRICS names per batch, so a rollout
cannot flood the metrics with ids. Torch-free: the controller and `areal-graph eval` both use it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

MAX_ENV_METRICS = 32


def env_metric_means(infos: Sequence[str | dict[str, Any] | None], prefix: str = "env") -> dict[str, float]:
    """`{prefix/<name>: mean}` over the trajectories whose `info["metrics"]` has a number for it
    (`infos`: each trajectory's info, as the JSON the packed batch carries or as a dict)."""
    sums: dict[str, list[float]] = {}
    for raw in infos:
        try:
            info = json.loads(raw) if isinstance(raw, str) else (raw or {})
        except ValueError:
            continue
        metrics = info.get("metrics") if isinstance(info, dict) else None
        if not isinstance(metrics, dict):
            continue
        for name, value in metrics.items():
            if isinstance(value, bool):
                value = float(value)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            key = re.sub(r"[^\w.-]", "_", str(name)) or "_"
            if key not in sums and len(sums) >= MAX_ENV_METRICS:
                continue
            total = sums.setdefault(key, [0.0, 0.0])
            total[0] += float(value)
            total[1] += 1.0
    return {(f"{prefix}/{k}" if prefix else k): s / n for k, (s, n) in sorted(sums.items())}
