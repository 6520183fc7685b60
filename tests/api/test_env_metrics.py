"""An environment's own numbers (Trajectory.info["metrics"]) as run metrics: means over the
trajectories that report each name, bools as 0/1, anything else ignored, names bounded."""

from __future__ import annotations

import json

from areal_graph.api.env_metrics import MAX_ENV_METRICS, env_metric_means


def test_means_over_the_trajectories_that_report_each_name():
    infos = [
        json.dumps({"metrics": {"turns": 2, "solved_first": False}}),
        json.dumps({"metrics": {"turns": 1, "solved_first": True, "invalid moves": 3}}),
        {"metrics": {"turns": 2}},  # a dict is read as well as the packed JSON
        json.dumps({"prompt_id": "p1"}),
        None,
        "not json",
        json.dumps([1, 2]),
    ]
    assert env_metric_means(infos) == {"env/invalid_moves": 3.0, "env/solved_first": 0.5, "env/turns": 5 / 3}
    assert env_metric_means(infos[:1], prefix="eval/env") == {"eval/env/solved_first": 0.0, "eval/env/turns": 2.0}


def test_non_numbers_and_non_finite_values_are_ignored_and_names_are_bounded():
    infos = [{"metrics": {"a": "text", "b": float("nan"), "c": [1], "d": float("inf"), "e": 1}}]
    assert env_metric_means(infos) == {"env/e": 1.0}
    many = [{"metrics": {f"m{i:03d}": i for i in range(MAX_ENV_METRICS + 10)}}]
    assert len(env_metric_means(many)) == MAX_ENV_METRICS
    assert env_metric_means([{"metrics": "nope"}, {"metrics": None}]) == {}
