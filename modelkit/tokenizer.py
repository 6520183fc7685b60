"""A byte-level BPE tokenizer trained locally on the task text, wrapped as a HF fast tokenizer.

Why train one: nothing may be downloaded, and a small vocabulary (512) keeps the tiny model's
embedding cheap. Digits are split one per token (a pre-tokenizer rule) so numbers have a
regular, position-wise form the model can learn arithmetic on, instead of arbitrary merges.
The result is saved with `save_pretrained` and loads back with `AutoTokenizer.from_pretrained`,
exactly like a hub tokenizer, so nothing downstream knows it is home-made.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from pathlib import Path

BOS = "<|bos|>"
EOS = "<|im_end|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START]

# ChatML-like; the prompt ends with the assistant header so generation starts the answer.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The same layout plus tool use in the Hermes / Qwen2.5 convention (api/tool_calls.py): an
# assistant message carrying `tool_calls` renders each call as a <tool_call> block (its
# arguments a dict, or a JSON string as OpenAI clients send them) and a `tool` message is a
# turn of its own. Tool schemas passed as `tools` are not rendered: the tiny context has no
# room for them, and a kit's model learns its one tool from the SFT data.
TOOL_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "<|im_start|>assistant\n{% if message['content'] %}{{ message['content'] }}\n{% endif %}"
    "{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    '{% if not loop.first %}\n{% endif %}<tool_call>\n{"name": "{{ fn[\'name\'] }}", "arguments": '
    "{% if fn['arguments'] is string %}{{ fn['arguments'] }}{% else %}{{ fn['arguments'] | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# One token each, as in Qwen2.5; added as ordinary (not special) tokens so decoding with
# skip_special_tokens keeps them and a parser sees the calls.
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512, tools: bool = False):
    """Train a byte-level BPE on `texts`; returns a `PreTrainedTokenizerFast` with specials and a chat template.

    `tools`: the tool-use chat template and the `<tool_call>` tokens (TOOL_CHAT_TEMPLATE);
    `texts` should then hold the tool-call boilerplate too, so that it gets merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The chat roles are part of every prompt: give them merges too.
    roles = ["user\n", "assistant\n", "system\n"] * 50 + (["tool\n"] * 50 if tools else [])
    tok.train_from_iterator(itertools.chain(roles, texts), trainer=trainer)
    if tools:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        padding_side="left",  # generation pads on the left; SFT pads explicitly
        model_max_length=1024,
    )
    fast.chat_template = TOOL_CHAT_TEMPLATE if tools else CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    pin_unknown_token(path)
    return path


def pin_unknown_token(path: str | Path) -> bool:
    """Say in `tokenizer_config.json` that the tokenizer has no unknown token (byte-level BPE
    needs none); True when the file changed.

    Why: `AutoTokenizer` picks the class from the model's config (`Qwen2Tokenizer` for the
    kit), and that class's constructor adds `<|endoftext|>` as its unknown token when the
    config names none: a token id one past the model's embedding rows, which crashes any tool
    that appends it. Idempotent."""
    config = Path(path) / "tokenizer_config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    if "unk_token" in data:
        return False
    data["unk_token"] = None
    tmp = config.with_name(config.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(config)  # atomic: a reader in another process sees the old or the new file
    return True
