"""engines/training/optimizer_steps.py: the optimizer step both training backends share
(lr schedule, clip, a skipped step on a non-finite norm, `version`, the step's stats), checked
on a bare linear layer; tests/engines/training/test_train_engine.py checks it inside TrainEngine."""

from __future__ import annotations

import pytest
import torch

from areal_graph.engines.training.optimizer_steps import OptimizerSteps, lr_factor
from support.batches import random_batch


class _Linear(OptimizerSteps):
    def __init__(self, trainable: bool = True, **schedule) -> None:
        self.model = torch.nn.Linear(3, 1)
        super().__init__(
            **{"lr": 0.1, "grad_clip": 1.0, "warmup_steps": 2, "lr_schedule": "constant", "total_steps": 1, **schedule}
        )
        if trainable:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, scale: float) -> dict[str, float]:
        t0, lr = self._begin_step()
        loss = self.model(torch.ones(1, 3)).sum() * scale
        loss.backward()
        grad_norm = self._take_step()
        return self._step_stats({"mine": 1.0}, random_batch(n=2), t0, lr, float(loss.detach()), grad_norm, 1, 1)


def test_lr_schedules():
    assert [lr_factor(s, 2, 10, "constant") for s in range(3)] == [0.5, 1.0, 1.0]
    assert lr_factor(10, 0, 10, "linear") == 0.0 and lr_factor(5, 0, 10, "linear") == 0.5
    assert abs(lr_factor(5, 0, 10, "cosine") - 0.5) < 1e-12 and lr_factor(0, 0, 10, "cosine") == 1.0
    with pytest.raises(ValueError, match="unknown lr_schedule"):
        lr_factor(0, 0, 10, "step")


def test_a_step_warms_up_clips_counts_versions_and_reports_the_same_keys():
    engine = _Linear(total_steps=5)
    first, second = engine.step(1.0), engine.step(1.0)
    assert (first["lr"], second["lr"], engine.version) == (0.05, 0.1, 2)
    assert first["mine"] == 1.0 and first["grad_norm"] > 1.0  # the norm before clipping
    assert first.keys() == {"mine", "loss", "grad_norm", "lr", "tokens", "tokens_per_s"} | {
        "n_microbatches",
        "n_forwards",
        "time_s",
    }


def test_a_non_finite_norm_skips_the_step_but_counts_the_version():
    engine = _Linear()
    before = engine.model.weight.detach().clone()
    engine.step(float("nan"))
    assert engine.version == 1 and torch.equal(engine.model.weight, before)


def test_a_frozen_engine_refuses_to_step():
    engine = _Linear(trainable=False)
    with pytest.raises(RuntimeError, match="trainable=False"):
        engine.step(1.0)
    assert engine.version == 0
