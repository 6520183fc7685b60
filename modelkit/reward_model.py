"""`builtin:tiny-arith-rm`: a tiny reward model for the tiny-arith kit, built here in seconds.

What a user's trained reward model is, at the kit's scale: a sequence classifier (one logit,
Bradley-Terry style) on the warm start's backbone, trained on the kit's own problems to tell a
right answer from a wrong one: worked solutions (positive), the same with a wrong final
answer (negative), and hasty answers, right (positive) or wrong (negative). It cannot do the
arithmetic of a hasty answer, so it learns what a verifier would reward on average: worked
answers that agree with their last step. Deterministic for a recipe on one machine; cached
under $AREAL_GRAPH_CACHE like the kits (modelkit/kit_cache.py), its held-out accuracy in
`reward_model.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from areal_graph.data.arith import hasty_answer
from areal_graph.modelkit.kit_cache import cache_root, ensure_kit, exclusive
from areal_graph.modelkit.recipes import BUILTIN_KITS
from areal_graph.modelkit.warm_start import encode_pair

log = logging.getLogger(__name__)

RM_FORMAT = 2  # 2: wrong answers are the warm start's own (one operation short)


@dataclass(frozen=True)
class RewardModelRecipe:
    name: str = "tiny-arith-rm"
    kit: str = "tiny-arith"  # the builtin kit whose backbone, tokenizer and problems it uses
    n_train: int = 4000  # labelled answers (a quarter of each kind)
    n_test: int = 400
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0

    def fingerprint(self) -> str:
        blob = json.dumps({"format": RM_FORMAT, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


TINY_ARITH_RM = RewardModelRecipe()
BUILTIN_REWARD_MODELS: dict[str, RewardModelRecipe] = {"tiny-arith-rm": TINY_ARITH_RM}


def labelled_answers(rows: list[dict], n: int, seed: int) -> list[tuple[str, str, float]]:
    """(question, answer text, label): worked right (1), worked with a wrong final answer (0),
    hasty right (1) and hasty wrong (0), a quarter each, from the kit's rows. A wrong answer
    is the warm start's own mistake where it is one: the value one operation short
    (data/arith.py:hasty_answer), else a small offset."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        row = rows[rng.randrange(len(rows))]
        answer = str(row["answer"])
        short = hasty_answer(row)[len("The answer is \\boxed{") : -2]
        wrong = short if short != answer else str(int(answer) + rng.choice([d for d in range(-9, 10) if d]))
        kind = i % 4
        if kind == 0:
            out.append((row["question"], row["solution"], 1.0))
        elif kind == 1:
            out.append((row["question"], row["solution"].replace(f"\\boxed{{{answer}}}", f"\\boxed{{{wrong}}}"), 0.0))
        else:
            final = answer if kind == 2 else wrong
            out.append((row["question"], f"The answer is \\boxed{{{final}}}.", 1.0 if kind == 2 else 0.0))
    return out


def build_reward_model(recipe: RewardModelRecipe, kit_path: Path, out: Path, progress: Callable[[str], None]) -> dict:
    """Train the classifier into `out` (model + tokenizer); returns what goes into reward_model.json."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(recipe.seed)
    tok = AutoTokenizer.from_pretrained(kit_path / "model")
    rows = {
        s: [json.loads(line) for line in (kit_path / "data" / f"{s}.jsonl").read_text().splitlines() if line]
        for s in ("train", "test")
    }
    data = {
        s: [(encode_pair(tok, q, a)[0], y) for q, a, y in labelled_answers(rows[s], n, recipe.seed + k)]
        for k, (s, n) in enumerate((("train", recipe.n_train), ("test", recipe.n_test)))
    }
    model = AutoModelForSequenceClassification.from_pretrained(
        kit_path / "model", num_labels=1, pad_token_id=tok.pad_token_id
    )
    optim = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    rng = random.Random(recipe.seed)
    progress(f"reward model: {recipe.steps} steps on {len(data['train'])} labelled answers")
    model.train()
    losses = []
    for _step in range(recipe.steps):
        batch = rng.sample(data["train"], recipe.batch_size)
        ids, mask = _padded([x for x, _ in batch], tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([y for _, y in batch]))
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(float(loss.detach()))
    model.eval()
    accuracy = _accuracy(model, data["test"], tok.pad_token_id)
    k = max(len(losses) // 10, 1)
    progress(f"reward model: held-out accuracy {accuracy:.1%} ({len(data['test'])} answers)")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {
        "name": recipe.name,
        "recipe": dataclasses.asdict(recipe),
        "fingerprint": recipe.fingerprint(),
        "kit": str(kit_path),
        "heldout_accuracy": accuracy,
        "torch_threads": torch.get_num_threads(),
        "loss_first_tenth": sum(losses[:k]) / k,
        "loss_last_tenth": sum(losses[-k:]) / k,
    }


def _padded(seqs: list[list[int]], pad: int):
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    return ids, mask


def _accuracy(model, data: list[tuple[list[int], float]], pad: int) -> float:
    import torch

    right = 0
    with torch.no_grad():
        for k in range(0, len(data), 64):
            chunk = data[k : k + 64]
            ids, mask = _padded([x for x, _ in chunk], pad)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
            right += sum(int((lg > 0) == (y > 0.5)) for lg, (_, y) in zip(logits.tolist(), chunk))
    return right / max(len(data), 1)


def ensure_reward_model(
    recipe: RewardModelRecipe, root: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """The reward model's directory, built first if needed (once, even across processes)."""
    path = (root or cache_root()) / f"{recipe.name}-{recipe.fingerprint()}"
    if (path / "reward_model.json").exists():
        return path
    kit = ensure_kit(BUILTIN_KITS[recipe.kit], root=root, progress=progress)
    say = progress or (lambda msg: log.info("%s", msg))
    with exclusive(path.with_name(path.name + ".lock")):
        if (path / "reward_model.json").exists():
            return path
        tmp = path.with_name(path.name + f".building{os.getpid()}")
        try:
            info = build_reward_model(recipe, kit.path, tmp, say)
            (tmp / "reward_model.json").write_text(json.dumps(info, indent=2) + "\n")
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path
