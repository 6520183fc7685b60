"""What the embedded engine refuses, as exceptions the HTTP routes can name without importing torch.

Why a module of its own: the OpenAI routes turn these into 400 and 503 answers, and the
routes are imported by the server's argument checks (`validate`), which must not pay for torch.
"""

from __future__ import annotations

__all__ = ["InvalidRequestError", "QueueFullError"]


class InvalidRequestError(ValueError):
    """The request cannot be served as given (empty prompt, bad token id, too long, bad sampling values)."""


class QueueFullError(RuntimeError):
    """Backpressure: the waiting queue is at `max_queue`; retry later."""
