"""Tiny-model kit: a locally trained tokenizer, a tiny Qwen2 model and its SFT warm start, built offline."""
