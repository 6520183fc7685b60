"""What tests share: paths, the e2e kit and CLI helpers, tiny models, reference log-probs,
batches, and the modules that worker subprocesses import (fake kinds, reward functions).

`tests/` is on pytest's `pythonpath` (pyproject), so tests import `support.<module>`; a test
never imports another test module. Subprocesses get the same through `paths.child_env()`.
"""
