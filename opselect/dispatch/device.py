"""What the dispatcher needs to know about a device, read once per device and kept.

Triton kernels run on CUDA devices, or on the CPU under Triton's interpreter when TRITON_INTERPRET=1 was
set before triton was imported (triton decides this when a kernel is decorated, so we read it once too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

#: True when Triton kernels run through the interpreter (set before triton's first import).
INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # "cuda" or "cpu"
    index: int | None
    name: str
    capability: tuple[int, int] | None
    sm_count: int
    l2_bytes: int
    memory_bytes: int

    @property
    def runs_triton(self) -> bool:
        return self.type == "cuda" or (self.type == "cpu" and INTERPRETED)

    @property
    def interpreted(self) -> bool:
        return self.type == "cpu" and INTERPRETED

    @property
    def cache_key(self) -> str:
        """Identity of the hardware in the tune cache: two identical GPUs share their timings."""
        if self.type == "cpu":
            return "cpu-interpreter" if INTERPRETED else "cpu"
        major, minor = self.capability or (0, 0)
        return f"{self.name}|sm_{major}{minor}|{self.sm_count}sm"


_infos: dict[torch.device, DeviceInfo] = {}


def device_info(device: torch.device) -> DeviceInfo:
    """Keyed by the device object itself (a tensor's .device): one dict lookup per call."""
    info = _infos.get(device)
    if info is None:
        info = _infos[device] = _read_device(device)
    return info


def _read_device(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return DeviceInfo(
            type="cuda",
            index=index,
            name=props.name,
            capability=(props.major, props.minor),
            sm_count=props.multi_processor_count,
            # L2 size is exposed from torch 2.x on as L2_cache_size; older builds lack it.
            l2_bytes=int(getattr(props, "L2_cache_size", 40 * 2**20)),
            memory_bytes=int(props.total_memory),
        )
    return DeviceInfo(
        type=device.type,
        index=device.index,
        name=device.type,
        capability=None,
        sm_count=os.cpu_count() or 1,
        l2_bytes=2**20,
        memory_bytes=0,
    )
