"""JSON from files, servers and other processes, with its numbers bounded before Python converts
them.

Python's json turns a run of digits into an int of any size (past 4,300 digits CPython refuses
with a ValueError that is no JSONDecodeError, and below that a long one costs quadratic time),
and reads NaN, Infinity and 1e400 as floats no record of ours holds. Here each number's text is
checked first: an integer of at most MAX_INT_DIGITS digits (an int64 has 19), a float of at most
MAX_FLOAT_CHARS characters that is finite, and no NaN / Infinity constants. Anything else raises
NumberRefused, a ValueError naming what was refused.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import NumberRefused

MAX_INT_DIGITS = 40
MAX_FLOAT_CHARS = 64


def _shown(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}...{text[-8:]}"


def _int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise NumberRefused(f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are read)")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise NumberRefused(f"a number written in {len(text)} characters (at most "
                            f"{MAX_FLOAT_CHARS} are read)")
    value = float(text)
    if not math.isfinite(value):
        raise NumberRefused(f"the number {_shown(text)}, out of a float's range")
    return value


def _constant(name: str) -> Any:
    raise NumberRefused(f"{name}, which is not a JSON number")


#: json.JSONDecoder with the bounds above (raw_decode for one value at a time)
DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)


def loads(text: str | bytes) -> Any:
    """json.loads with the bounds above: NumberRefused, or json.JSONDecodeError."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    return DECODER.decode(text)
