"""lm-evaluation-harness, unchanged, against the embedded engine's OpenAI routes.

lm-eval's `local-completions` model sends token ids: log-likelihood requests with `echo`,
`logprobs: 1` and `max_tokens: 1` (it reads `token_logprobs[ctxlen:-1]`), generation requests
with `stop`. Two local tasks over the builtin arithmetic test set: a multiple-choice one (the
number in the box of a worked solution, among three wrong ones: log-likelihoods) and a generation one (the worked solution,
exact match on its boxed answer). Slow (about 35 s) and optional: lm-eval is no dependency
of ours (it leaves torch and transformers as they are). To run it:

    .venv/bin/pip install 'lm-eval[api]==0.4.13'
    .venv/bin/python -m pytest -m slow tests/engines/inference/server/test_lm_eval.py -s

Measured 2026-11-26 on 40 test problems: multiple choice acc 1.0, generation exact match 0.2
(the kit model's greedy accuracy is ~16%).
"""

from __future__ import annotations

import json
import random

import pytest

pytestmark = pytest.mark.slow

MC_TASK = """task: arith_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
"""

GEN_TASK = """task: arith_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["</s>", "<|im_end|>"]
  max_gen_toks: 64
  do_sample: false
filter_list:
  - name: boxed
    filter:
      - function: regex
        regex_pattern: "boxed\\\\{{(-?[0-9]+)\\\\}}"
      - function: take_first
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def kit_server():
    from areal_graph.engines.inference.server.process import ServerProcess
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path

    model = resolve_model_path("builtin:tiny-arith")
    proc = ServerProcess(
        str(model), extra_args=["--threads", "2", "--max-running", "32", "--served-model-name", "tiny-arith"]
    )
    proc.start()
    yield proc.url, model, resolve_dataset_path("builtin:arith/test")
    proc.stop()


def write_tasks(tmp_path, test_jsonl, tokenizer_dir) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(0)
    rows = [json.loads(line) for line in open(test_jsonl)][:40]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
        )
        for r in rows
    ]
    with open(tmp_path / "mc.jsonl", "w") as f:  # the worked solution up to its box; which number goes in?
        for r, prompt in zip(rows, prompts):
            right = int(r["answer"])
            choices = [f"{right}}}", f"{right + 1}}}", f"{right - 2}}}", f"{right + 10}}}"]
            rng.shuffle(choices)
            context = prompt + r["solution"][: r["solution"].rindex("boxed{") + len("boxed{")]
            f.write(json.dumps({"context": context, "choices": choices, "label": choices.index(f"{right}}}")}) + "\n")
    with open(tmp_path / "gen.jsonl", "w") as f:
        for r, prompt in zip(rows, prompts):
            f.write(json.dumps({"prompt": prompt, "answer": r["answer"]}) + "\n")
    (tmp_path / "arith_mc.yaml").write_text(MC_TASK.format(data=tmp_path / "mc.jsonl"))
    (tmp_path / "arith_gen.yaml").write_text(GEN_TASK.format(data=tmp_path / "gen.jsonl"))


def test_lm_eval_scores_a_multiple_choice_and_a_generation_task(kit_server, tmp_path):
    pytest.importorskip("lm_eval")  # here, not at import: a default run deselects the test without a note
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    url, model_dir, test_jsonl = kit_server
    write_tasks(tmp_path, test_jsonl, model_dir)
    results = simple_evaluate(
        model="local-completions",
        model_args=(
            f"model=tiny-arith,base_url={url}/v1/completions,tokenizer={model_dir},"
            "tokenized_requests=True,num_concurrent=4,max_retries=1"
        ),
        tasks=["arith_mc", "arith_gen"],
        task_manager=TaskManager(include_path=str(tmp_path)),
    )
    mc, gen = results["results"]["arith_mc"], results["results"]["arith_gen"]
    print({"arith_mc acc": mc["acc,none"], "arith_gen exact_match": gen["exact_match,boxed"]})
    assert 0.0 <= mc["acc,none"] <= 1.0 and 0.0 <= gen["exact_match,boxed"] <= 1.0
    # the model was trained on such solutions: given one up to its box, the log-likelihoods pick
    # the number its last line computed far above chance (1 in 4); its own solutions box the
    # right answer about as often as its greedy accuracy (~16%)
    assert mc["acc,none"] >= 0.8
    assert gen["exact_match,boxed"] > 0.0
