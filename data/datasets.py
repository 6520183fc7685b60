"""PLACEHOLDER (lead): minimal loader so the runtime can be integrated; the kit owner replaces it."""
from __future__ import annotations
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Prompt:
    id: str
    text: str
    input_ids: list[int]
    answer: str


def load_prompts(path, tokenizer, prompt_template=None, question_key="question", answer_key="answer",
                 max_prompt_tokens=None):
    out, bad = [], 0
    for i, line in enumerate(Path(path).read_text().splitlines()):
        try:
            row = json.loads(line)
            q, a = str(row[question_key]), str(row[answer_key])
        except Exception:
            bad += 1
            continue
        text = tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        out.append(Prompt(str(i), text, tokenizer.encode(text, add_special_tokens=False), a))
    return out, {"loaded": len(out), "skipped": bad}
