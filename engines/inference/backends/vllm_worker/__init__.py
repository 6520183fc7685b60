"""Code that runs inside a vLLM server's worker processes (see areal_vllm_worker.py)."""
