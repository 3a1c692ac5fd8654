"""Pre-warming the tune cache: measure every candidate for the shapes a user will run.

A spec is a list of entries (YAML or JSON):

    - op: isin
      shapes: [[16777216], [1024]]        # one shape per tensor argument
      dtypes: [int32, int64]
      options: {invert: false, values: wide}
    - op: topk
      shapes: [[64, 128000]]
      dtypes: [bfloat16]
      options: {k: 50}
    - op: linear                          # input, weight (out_features x in_features)
      shapes: [[16, 4096], [11008, 4096]]
      dtypes: [bfloat16]
      options: {bias: false}

An entry may give `cases: [[...shapes...], ...]` instead of `shapes` for several shape sets. Each
op's `sample(shapes, dtype, options, device)` turns an entry into real arguments (random data of
the described distribution), and tuning measures them; each result is written to the cache as soon
as it is measured, so an interrupted warm keeps what it finished.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from .dispatch import Decision, get_op
from .errors import InvalidArgument, OpselectError, UsageError


@dataclass
class WarmItem:
    op: str
    shapes: list[list[int]]
    dtype: str
    options: dict[str, Any]

    def label(self) -> str:
        shapes = " ".join("x".join(map(str, s)) or "()" for s in self.shapes)
        opts = "".join(f" {k}={v}" for k, v in self.options.items())
        return f"{self.op} {shapes} {self.dtype}{opts}"


#: A spec is a small hand-written file: anything larger is a mistake (or not a spec).
SPEC_MAX_BYTES = 16 << 20


def load_spec(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a spec file: JSON for .json, YAML for anything else (YAML also reads JSON,
    so a spec named .txt works when its content is either). UsageError, one line, for a file
    that cannot be read or parsed."""
    path = Path(path)
    try:
        if path.stat().st_size > SPEC_MAX_BYTES:
            raise UsageError(f"spec {path}: {path.stat().st_size} bytes; a spec is at most "
                             f"{SPEC_MAX_BYTES} bytes")
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"spec {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"spec {path}: not a text file (expected YAML or JSON)") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError
        raise UsageError(f"spec {path}: malformed JSON ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError and its kin: name where it failed
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"spec {path}: malformed YAML{where}: {problem}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise UsageError(f"spec {path}: expected a list of entries (mappings with op, shapes, "
                         f"dtypes, options), got {type(data).__name__}")
    return data


def expand(entries: list[dict[str, Any]]) -> Iterator[WarmItem]:
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "op" not in entry:
            raise InvalidArgument(f"warm spec entry {i}: expected a mapping with an 'op' key, got {entry!r}")
        op = str(entry["op"])
        get_op(op)  # an unknown op fails here, naming the known ones
        unknown = set(entry) - {"op", "shapes", "cases", "dtypes", "dtype", "options"}
        if unknown:
            raise InvalidArgument(f"warm spec entry {i} ({op}): unknown keys {sorted(unknown)}; "
                                  "expected op, shapes or cases, dtypes, options")
        cases = entry.get("cases") or [entry.get("shapes")]
        if cases == [None]:
            raise InvalidArgument(f"warm spec entry {i} ({op}): give 'shapes' or 'cases'")
        dtypes = entry.get("dtypes") or [entry.get("dtype", "float32")]
        if isinstance(dtypes, str):
            dtypes = [dtypes]  # `dtypes: float32` means the one dtype, not its letters
        options = dict(entry.get("options") or {})
        for shapes, dtype in itertools.product(cases, dtypes):
            if (not isinstance(shapes, list) or not all(isinstance(s, list) for s in shapes)
                    or not all(type(d) is int for s in shapes for d in s)):
                raise InvalidArgument(f"warm spec entry {i} ({op}): shapes must be a list of "
                                      f"shapes (lists of ints), got {shapes!r}")
            yield WarmItem(op, [list(s) for s in shapes], str(dtype), options)


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise UsageError(f"dtype {name!r}: not a torch dtype; expected a name such as float32, "
                         "bfloat16, int64")
    return dtype


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(name: str | None) -> torch.device:
    """--device: cpu, cuda or cuda:N that this machine has (UsageError otherwise)."""
    if not name:
        return default_device()
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {name}: not a device; expected cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"--device {name}: this machine has no CUDA device "
                             "(torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= count:
            raise UsageError(f"--device {name}: this machine has {count} CUDA device(s)")
    elif device.type != "cpu":
        raise UsageError(f"--device {name}: expected cpu or cuda, got {device.type}")
    return device


def _memory_of(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def make_inputs(op_name: str, shapes: list[list[int]], dtype: torch.dtype, options: dict,
                device: torch.device) -> tuple[tuple, dict]:
    """op.sample()'s inputs, after checking what would only fail deep inside it: negative dims,
    and tensors larger than the device's memory (said before anything is allocated). A call the
    op rejects (a dtype it does not take, a bad option) is a UsageError naming the item."""
    op = get_op(op_name)
    if op.sample is None:
        raise UsageError(f"op {op_name} cannot be warmed from a spec (no sample())")
    label = f"{op_name} {' '.join('x'.join(map(str, s)) or '()' for s in shapes)} " \
            f"{str(dtype).replace('torch.', '')}"
    for shape in shapes:
        if any(d < 0 for d in shape):
            raise UsageError(f"{label}: shapes: dims must be >= 0, got {shape}")
    need = sum(math.prod(s) for s in shapes) * dtype.itemsize
    have = _memory_of(device)
    if need > have // 2:
        raise UsageError(f"{label}: the inputs alone need {need / 2**30:.3g} GiB, more than half "
                         f"of {device}'s {have / 2**30:.3g} GiB")
    try:
        return op.sample(shapes, dtype, dict(options), device)
    except OpselectError as exc:
        raise UsageError(f"{label}: {exc}") from None
    except (RuntimeError, ValueError, TypeError) as exc:  # torch refused the inputs
        raise UsageError(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def warm_item(item: WarmItem, device: torch.device | None = None) -> Decision:
    device = device or default_device()
    args, kwargs = make_inputs(item.op, item.shapes, parse_dtype(item.dtype), item.options,
                               device)
    op = get_op(item.op)
    try:
        op.prepare(*args, **kwargs)
    except OpselectError as exc:  # the op does not take this call (a dtype, an option)
        raise UsageError(f"{item.label()}: {exc}") from None
    return warm_call(item.op, args, kwargs)


def warm_call(op_name: str, args: tuple, kwargs: dict) -> Decision:
    """Measure every candidate for this call (those the cache lacks) and record them."""
    op = get_op(op_name)
    call = op.prepare(*args, **kwargs)
    decision = op.decide(call, tune=True)
    op.forget()  # the next call reads the fresh cache entry
    return decision
