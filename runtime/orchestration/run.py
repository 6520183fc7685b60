"""One RL run from a validated workflow: plan it, start its processes, run the controller, clean up.

The spec given here has local paths (`modelkit.builtin.resolve_builtin_paths` resolved any
`builtin:` ones at the edge). `run_with_auto_resume` is what `areal-graph run` calls, and what
a Python caller should: it honours `runtime.auto_resume`, and it opens the run's loggers
(`runtime.loggers`: TensorBoard, W&B, MLflow) once for the whole run, auto-resumes included,
and closes them at its end, failed or not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_graph.data.datasets import load_run_prompts
from areal_graph.graph.dump import workflow_mapping
from areal_graph.graph.plan import build_plan
from areal_graph.graph.spec import WorkflowSpec
from areal_graph.runtime.launchers.interrupt import interrupted
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.observability.tracing import Tracer
from areal_graph.runtime.observability.trackers import TrackerSettings, open_trackers
from areal_graph.runtime.orchestration.controller import Controller, RunFailed, RunState
from areal_graph.runtime.orchestration.process_executor import ProcessExecutor

log = logging.getLogger(__name__)


def run_workflow(
    spec: WorkflowSpec, run_dir: RunDir, display: Any | None = None, resume_from: Path | None = None
) -> RunState:
    plan = build_plan(spec)
    # a resumed run carries on its trace: one timeline across every part of the run
    # runtime.trace: false -> no trace file, and no process records spans (process_executor.py)
    max_mb = spec.runtime.trace_max_mb
    tracer = Tracer(
        run_dir.trace_path,
        enabled=spec.runtime.trace,
        append=resume_from is not None,
        max_bytes=max_mb * 2**20 if max_mb else None,
    )
    now = time.perf_counter()
    if resume_from is not None:
        tracer.record("resume", now, now, cat="controller", checkpoint=str(resume_from))
    tracer.record("plan", now, now, cat="controller", lines=plan.describe(), fused=dict(plan.fused))
    executor = ProcessExecutor(plan, run_dir)
    try:
        prompts, eval_prompts = load_run_prompts(spec.data, spec.models[plan.actor].path, spec.runtime.seed)
        controller = Controller(plan, executor, prompts, eval_prompts, run_dir, tracer, display)
        with tracer.span("startup", cat="controller"):
            executor.start(on_failure=controller.on_failure)
        now = time.perf_counter()
        tracer.record(
            "placement",
            now,
            now,
            cat="controller",
            processes=executor.placement_args(),
            pinned=spec.resources.pinned,
            host=platform.node(),
            cores=os.cpu_count(),
        )
        return controller.run(resume_from)
    finally:
        try:  # the last spans of the workers and servers, when they are still there to ask
            # (after Ctrl-C they are being stopped: asking would wait on each of them)
            if tracer.enabled and not interrupted():
                tracer.merge(asyncio.run(executor.collect_spans()))
        except Exception:  # noqa: BLE001 - a dead process must not hide the run's real error
            log.debug("collecting the last spans failed", exc_info=True)
        executor.shutdown()
        tracer.close()  # a full disk here is said, not raised over the run's own error


def run_with_auto_resume(
    spec: WorkflowSpec,
    run_dir: RunDir,
    display: Any | None = None,
    resume_from: Path | None = None,
    on_resume: Callable[[RunFailed, Path, int], None] | None = None,
) -> RunState:
    """`run_workflow`, continued in fresh processes from the latest complete checkpoint after a
    resumable failure (a model worker died), at most `runtime.auto_resume` times; `on_resume`
    (error, checkpoint, resume number) is told before each. Any other failure, one past the
    limit or one with no checkpoint to go on from, is raised; so is anything after Ctrl-C."""
    start_loggers(spec, run_dir)
    failed = True
    try:
        state = _run_resuming(spec, run_dir, display, resume_from, on_resume)
        failed = False
        return state
    finally:
        run_dir.close(failed=failed)


def start_loggers(spec: WorkflowSpec, run_dir: RunDir) -> None:
    """TensorBoard on or off and the experiment trackers of `runtime.loggers`, started with the
    workflow as it ran: the run directory's config.yaml when there is one (what `areal-graph run`
    wrote, and what repeats the run), else `spec` as a workflow mapping. Raises
    TrackerUnavailable (a ValueError naming runtime.loggers) when a tracker's package is missing."""
    loggers = spec.runtime.loggers
    config = run_dir.read_config() if run_dir.config_path.is_file() else workflow_mapping(spec)
    trackers = open_trackers(loggers, TrackerSettings.for_run(spec, run_dir.path), config)
    run_dir.set_loggers(tensorboard="tensorboard" in loggers, trackers=trackers)


def _run_resuming(
    spec: WorkflowSpec,
    run_dir: RunDir,
    display: Any | None,
    resume_from: Path | None,
    on_resume: Callable[[RunFailed, Path, int], None] | None,
) -> RunState:
    resumes = 0
    while True:
        try:
            return run_workflow(spec, run_dir, display=display, resume_from=resume_from)
        except RunFailed as err:
            latest = run_dir.latest_checkpoint()
            if interrupted() or not err.resumable or resumes >= spec.runtime.auto_resume or latest is None:
                err.resumes = resumes
                raise
            resumes += 1
            resume_from = latest
            if on_resume is not None:
                on_resume(err, latest, resumes)
