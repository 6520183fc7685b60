"""Inference engines (embedded torch engine, SGLang) and the one client that drives them."""
