"""Rows of a dataset file, whatever it is stored as: JSONL, a JSON array, parquet, or a
Hugging Face `datasets` folder (`Dataset.save_to_disk`).

Bounded, whatever the file holds: JSONL streams line by line (a line over `MAX_ROW_BYTES` is
skipped without being held), parquet and Arrow are read a record batch at a time, and only a
.json array is read whole (under `MAX_JSON_FILE_BYTES`). Rows that cannot be decoded are
counted in the `LoadReport` with their line or row number; a file that cannot be read at all
is a `DatasetError` naming it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Bounds on what one file may make us hold in memory: a JSONL row, and a whole .json array.
MAX_ROW_BYTES = 1 << 20
MAX_JSON_FILE_BYTES = 256 << 20
ARROW_BATCH_ROWS = 1024  # parquet / Arrow rows decoded at a time
# How many skipped rows are named individually in the log before only counting.
_NAMED_SKIPS = 5


class DatasetError(ValueError):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


@dataclass
class LoadReport:
    """What happened to every row of a file: loaded, or skipped and why."""

    path: str
    loaded: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "line 7: missing 'answer'"

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def skip(self, line: int, reason: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        if len(self.examples) < _NAMED_SKIPS:
            self.examples.append(f"line {line}: {reason}{': ' + detail if detail else ''}")

    def __str__(self) -> str:
        text = f"{self.path}: {self.loaded} rows loaded"
        if self.total_skipped:
            reasons = ", ".join(f"{n} {r}" for r, n in self.skipped.most_common())
            text += f", {self.total_skipped} skipped ({reasons})"
        return text


def iter_rows(path: str | Path, report: LoadReport) -> Iterator[tuple[int, Any]]:
    """(line or row number, decoded row) of a .jsonl / .ndjson / .json / .parquet file or a
    `save_to_disk` folder (see module docstring)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset {path} does not exist")
    if path.is_dir():
        yield from enumerate(_hf_disk_rows(path), start=1)
        return
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from enumerate(_parquet_rows(path), start=1)
    elif suffix == ".json":
        yield from enumerate(_json_array(path), start=1)
    elif suffix in (".jsonl", ".ndjson"):
        yield from _jsonl_rows(path, report)
    else:
        raise DatasetError(
            f"dataset {path}: unknown format {suffix!r} (use .jsonl, .json, .parquet or a "
            "folder written by datasets' save_to_disk)"
        )


# --------------------------------------------------------------------------- JSON
def _jsonl_rows(path: Path, report: LoadReport) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as f:
        i = 0
        while True:
            raw = f.readline(MAX_ROW_BYTES + 1)
            if not raw:
                return
            i += 1
            if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # drop the rest of the line, a chunk at a time
                    raw = f.readline(MAX_ROW_BYTES)
                report.skip(i, "row too long", f"over {MAX_ROW_BYTES:,} bytes")
                continue
            row = _decode_line(raw, i, report)
            if row is not _SKIPPED:
                yield i, row


_SKIPPED = object()


def _decode_line(raw: bytes, i: int, report: LoadReport) -> Any:
    if not raw.strip():
        return _SKIPPED
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        report.skip(i, "not UTF-8", f"byte 0x{raw[err.start]:02x} at column {err.start + 1}")
    except json.JSONDecodeError as err:
        report.skip(i, "invalid JSON", str(err))
    except RecursionError:
        report.skip(i, "nested too deeply")
    return _SKIPPED


def _json_array(path: Path) -> list:
    if path.stat().st_size > MAX_JSON_FILE_BYTES:
        raise DatasetError(
            f"dataset {path}: a .json dataset is read whole and must be under "
            f"{MAX_JSON_FILE_BYTES >> 20} MiB; write it as JSONL (one row per line)"
        )
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DatasetError(f"dataset {path}: not UTF-8 text (byte offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise DatasetError(f"dataset {path}: not valid JSON ({err})") from None
    except RecursionError:
        raise DatasetError(f"dataset {path}: JSON nested too deeply to read") from None
    if not isinstance(data, list):
        raise DatasetError(f"dataset {path}: a .json dataset must hold a list of rows")
    return data


# --------------------------------------------------------------------------- Arrow
def _pyarrow(path: Path, what: str) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401  (the submodules are not imported by `import pyarrow`)
        import pyarrow.parquet  # noqa: F401
    except ImportError as err:
        raise DatasetError(
            f"dataset {path}: reading {what} needs pyarrow (pip install 'areal-graph[parquet]')"
        ) from err
    return pyarrow


def _parquet_rows(path: Path) -> Iterator[dict]:
    pa = _pyarrow(path, "parquet")
    try:
        reader = pa.parquet.ParquetFile(path)
        for batch in reader.iter_batches(batch_size=ARROW_BATCH_ROWS):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as err:  # a truncated or corrupt file, at open or mid-read
        raise DatasetError(f"dataset {path}: not a readable parquet file ({err})") from err


def _hf_disk_rows(path: Path) -> Iterator[dict]:
    """The rows of a `Dataset.save_to_disk` folder: its Arrow stream files, in `state.json`'s order."""
    state_file = path / "state.json"
    if not state_file.is_file():
        splits = path / "dataset_dict.json"
        if splits.is_file():
            names = json.loads(splits.read_text(encoding="utf-8")).get("splits", [])
            raise DatasetError(
                f"dataset {path} holds several splits ({', '.join(map(str, names))}): name one, "
                f"e.g. {path / str(names[0]) if names else path / 'train'}"
            )
        raise DatasetError(
            f"dataset {path} is a folder but not one written by datasets' save_to_disk "
            "(no state.json); give a .jsonl, .json or .parquet file"
        )
    try:
        files = [path / str(f["filename"]) for f in json.loads(state_file.read_text(encoding="utf-8"))["_data_files"]]
    except (ValueError, KeyError, TypeError) as err:
        raise DatasetError(f"dataset {path}: unreadable state.json ({err})") from None
    pa = _pyarrow(path, "a save_to_disk folder")
    for file in files:
        if file.parent != path or not file.is_file():
            raise DatasetError(f"dataset {path}: state.json names {file.name!r}, which is not a file of the folder")
        try:
            with pa.memory_map(str(file)) as source:
                for batch in pa.ipc.open_stream(source):
                    yield from batch.to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise DatasetError(f"dataset {path}: {file.name} is not a readable Arrow stream ({err})") from err
