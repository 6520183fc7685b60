"""A tiny model that has learned two conversations by heart, for the OpenAI-compatibility tests.

Why: the OpenAI tests must check tool calls, multi-turn episodes and stop strings end to end
with a real model, server and client, and a random model never writes a `<tool_call>`.
Overfitting a 2-layer Qwen2 (hidden 64) on three hand-written ChatML conversations takes
about a second; greedy decoding then reproduces them exactly (the builder checks this).

The texts are written out here character for character, independently of the code under
test: if the server rendered a prompt differently (the tool message, the assistant's tool
call), the model would not recognise it and the tests that continue a conversation fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import openai

    from areal_graph.workflows.rollout.openai_agent import AgentPrompt

BOS, EOS = "<|bos|>", "<|im_end|>"
ADD_QUESTION = "What is 2 plus 3? Use the add tool."
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ADD_RESULT = "5"
ADD_ANSWER = "The answer is 5."
HELLO_QUESTION = "Say hello."
HELLO_ANSWER = "Hello there, how are you?"


def user_prompt(question: str) -> str:
    return f"{BOS}<|im_start|>user\n{question}{EOS}\n<|im_start|>assistant\n"


# (prompt, answer) pairs: the model learns each answer after its prompt
ADD_TURN1 = (user_prompt(ADD_QUESTION), ADD_CALL + EOS)
ADD_TURN2 = (
    ADD_TURN1[0] + ADD_TURN1[1] + f"\n<|im_start|>tool\n{ADD_RESULT}{EOS}\n<|im_start|>assistant\n",
    ADD_ANSWER + EOS,
)
HELLO_TURN = (user_prompt(HELLO_QUESTION), HELLO_ANSWER + EOS)
CONVERSATIONS = [ADD_TURN1, ADD_TURN2, HELLO_TURN]

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def _train(tokenizer, seed: int = 0, max_steps: int = 400):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    batches = []
    for prompt, answer in CONVERSATIONS:
        p = tokenizer(prompt, add_special_tokens=False).input_ids
        a = tokenizer(answer, add_special_tokens=False).input_ids
        batches.append((torch.tensor([p + a]), torch.tensor([[-100] * len(p) + a])))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(max_steps):
        outs = [model(input_ids=ids, labels=labels) for ids, labels in batches]
        if min(_label_prob(o.logits, labels) for o, (_, labels) in zip(outs, batches)) > 0.9:
            break  # every answer token is the clear argmax given the true prefix: greedy reproduces it
        loss = sum(o.loss for o in outs)
        optim.zero_grad()
        loss.backward()
        optim.step()
    return model.eval()


def _label_prob(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The smallest probability the model gives a label token (teacher forcing)."""
    probs = torch.softmax(logits[0, :-1].detach(), -1)
    target = labels[0, 1:]
    keep = target != -100
    return float(probs[keep].gather(1, target[keep].unsqueeze(1)).min())


def _knows_by_heart(model, tokenizer) -> bool:
    return all(greedy(model, tokenizer, prompt) == answer for prompt, answer in CONVERSATIONS)


@torch.no_grad()
def greedy(model, tokenizer, prompt: str, max_new: int = 60) -> str:
    """Plain greedy decoding with full forwards (independent of the engine)."""
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    out: list[int] = []
    for _ in range(max_new):
        tok = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
        out.append(tok)
        if tok == tokenizer.eos_token_id:
            break
    return tokenizer.decode(out, skip_special_tokens=False)


@functools.cache
def build_tool_model(root: str) -> tuple[Path, Path]:
    """(model dir, perturbed copy's dir) under `root`, built once per process.

    The copy has the same architecture with noise added to every weight: loading it into a
    server mid-generation changes what the model writes (the interruption tests)."""
    from areal_graph.modelkit.tokenizer import train_tokenizer

    texts = [part for pair in CONVERSATIONS for part in pair] * 20
    tokenizer = train_tokenizer(texts, vocab_size=420, tools=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: two threads only spin against each other on a busy machine
    try:
        model = _train(tokenizer)
    finally:
        torch.set_num_threads(threads)
    if not _knows_by_heart(model, tokenizer):
        raise RuntimeError("the test model did not learn its conversations by heart")
    out, other = Path(root) / "tool_model", Path(root) / "tool_model_v1"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(other)
    tokenizer.save_pretrained(other)
    return out, other


def ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` alone (no special tokens), as the conversations are written."""
    return tokenizer(text, add_special_tokens=False).input_ids


async def add_agent(client: openai.AsyncOpenAI, prompt: AgentPrompt) -> float:
    """An ordinary tool-calling agent for the official client: ask, run the calls, ask again."""
    messages = list(prompt.messages)
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL])
    message = reply.choices[0].message
    messages.append(message)
    for call in message.tool_calls or []:
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    final = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL])
    return 1.0 if final.choices[0].message.content == ADD_ANSWER else 0.0


ADD_FUNCTION = {
    "type": "function",
    "name": "add",
    "description": ADD_TOOL["function"]["description"],
    "parameters": ADD_TOOL["function"]["parameters"],
}  # ADD_TOOL as the Responses API writes tools


async def add_agent_responses(client: openai.AsyncOpenAI, prompt: AgentPrompt) -> float:
    """`add_agent` on the Responses API: the function call items and their outputs go back as input."""
    items: list = list(prompt.messages)
    first = await client.responses.create(model="policy", input=items, tools=[ADD_FUNCTION])
    items += [item.model_dump(exclude_none=True) for item in first.output]
    for item in first.output:
        if item.type == "function_call":
            args = json.loads(item.arguments)
            items.append(
                {"type": "function_call_output", "call_id": item.call_id, "output": str(args["a"] + args["b"])}
            )
    final = await client.responses.create(model="policy", input=items, tools=[ADD_FUNCTION])
    return 1.0 if final.output_text == ADD_ANSWER else 0.0


def with_client(url: str, body: Any) -> Any:
    """Run `body(inference_client)` in a fresh event loop with a fresh InferenceClient."""
    from areal_graph.engines.inference.client import InferenceClient

    async def run() -> Any:
        client = InferenceClient(url)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(run())


def add_prompt(tokenizer: Any) -> AgentPrompt:
    """The add conversation as an agent's prompt (row "q1", answer "5")."""
    from areal_graph.workflows.rollout.openai_agent import AgentPrompt

    return AgentPrompt("q1", [{"role": "user", "content": ADD_QUESTION}], "5", ids(tokenizer, ADD_TURN1[0]))


@contextlib.contextmanager
def served_tool_model(model_dir: Path, api_key: str) -> Iterator[str]:
    """A real inference server (a subprocess) of the tool model that wants `api_key`; its URL."""
    from areal_graph.engines.inference.server.process import ServerProcess

    proc = ServerProcess(
        str(model_dir),
        extra_args=["--threads", "1", "--max-running", "8", "--api-key-env", "AREAL_TEST_OPENAI_KEY"],
        env={"AREAL_TEST_OPENAI_KEY": api_key},
    )
    proc.start()
    try:
        yield proc.url
    finally:
        proc.stop()
