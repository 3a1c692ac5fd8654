"""What the tune cache holds, as pydantic models validated on every read.

A record is trusted only if it parses, has this schema version, and was written under the same
software (torch, triton, opselect versions); the hardware is part of the record's key. Each backend's
timing carries the hash of that backend's kernel sources, so a changed kernel invalidates its own
timing and nothing else.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = 1

ConfigValue = Union[bool, int, float, str]


class Fingerprint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str  # name | compute capability | SM count (DeviceInfo.cache_key)
    torch: str
    triton: str
    opselect: str
    cuda: Optional[str] = None
    #: environment switches that change what backends run ("NAME=value,..."; opselect.switches)
    switches: Optional[str] = None


class Timing(BaseModel):
    # No NaN or infinity anywhere (a number JSON cannot hold is not one we wrote)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: median seconds; None: the backend failed when measured (never choose it for this key)
    seconds: Optional[float] = Field(default=None, ge=0)
    config: dict[str, ConfigValue] = Field(default_factory=dict)
    source_hash: str
    measured_at: float = Field(default_factory=time.time)
    #: how `seconds` was measured (dispatch.tuning_mode.METHOD); a timing measured another way
    #: (None: before this field, device time only) is measured again
    method: Optional[str] = Field(default=None, max_length=200)
    #: host and device seconds per call, measured apart (`seconds`, the steady-state time of
    #: an eager call, is the larger); under a CUDA graph only the device time counts
    host_s: Optional[float] = Field(default=None, ge=0)
    device_s: Optional[float] = Field(default=None, ge=0)


class TuneRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = SCHEMA
    op: str
    key: str  # repr of the call key without its device element
    fingerprint: Fingerprint
    timings: dict[str, Timing] = Field(default_factory=dict)

    def best(self) -> tuple[str, Timing] | None:
        done = [(n, t) for n, t in self.timings.items() if t.seconds is not None]
        return min(done, key=lambda nt: nt[1].seconds) if done else None


class Calibration(BaseModel):
    """Device constants measured by `opselect calibrate`, overriding the cost model's defaults."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = SCHEMA
    fingerprint: Fingerprint
    constants: dict[str, float] = Field(default_factory=dict)
    #: per "op/backend": measured over predicted time, geometric mean over the calibration shapes
    scales: dict[str, float] = Field(default_factory=dict)
    measured_at: float = Field(default_factory=time.time)


class ExportFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    opselect_export: Literal[1] = 1
    entries: list[dict[str, Any]]
