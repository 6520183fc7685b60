"""PLACEHOLDER (lead): path resolution so the runtime can be integrated; the kit owner replaces it."""
from pathlib import Path


def resolve_model_path(path: str) -> Path:
    return Path(path)


def resolve_dataset_path(spec: str) -> Path:
    return Path(spec)
