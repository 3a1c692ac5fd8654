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

An entry may give `cases: [[...shapes...], ...]` instead of `shapes` for several shape sets. Each
op's `sample(shapes, dtype, options, device)` turns an entry into real arguments (random data of
the described distribution), and tuning measures them; each result is written to the cache as soon
as it is measured, so an interrupted warm keeps what it finished.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from .dispatch import Decision, get_op
from .errors import InvalidArgument


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


def load_spec(path: str | Path) -> list[dict[str, Any]]:
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise InvalidArgument(f"warm spec {path}: expected a list of entries, got {type(data).__name__}")
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
        options = dict(entry.get("options") or {})
        for shapes, dtype in itertools.product(cases, dtypes):
            if not isinstance(shapes, list) or not all(isinstance(s, list) for s in shapes):
                raise InvalidArgument(f"warm spec entry {i} ({op}): shapes must be a list of "
                                      f"shapes (lists of ints), got {shapes!r}")
            yield WarmItem(op, [[int(d) for d in s] for s in shapes], str(dtype), options)


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgument(f"unknown dtype {name!r}; expected a torch dtype name such as float32")
    return dtype


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def warm_item(item: WarmItem, device: torch.device | None = None) -> Decision:
    op = get_op(item.op)
    if op.sample is None:
        raise InvalidArgument(f"op {item.op} cannot be warmed from a spec (no sample())")
    device = device or default_device()
    args, kwargs = op.sample(item.shapes, parse_dtype(item.dtype), dict(item.options), device)
    return warm_call(item.op, args, kwargs)


def warm_call(op_name: str, args: tuple, kwargs: dict) -> Decision:
    """Measure every candidate for this call (those the cache lacks) and record them."""
    op = get_op(op_name)
    call = op.prepare(*args, **kwargs)
    decision = op.decide(call, tune=True)
    op.forget()  # the next call reads the fresh cache entry
    return decision
