"""The environment a timing was measured in: hardware plus the software that shapes the kernels."""

from __future__ import annotations

import functools

import torch

from .._version import __version__
from ..dispatch.device import DeviceInfo


@functools.lru_cache(maxsize=None)
def _software() -> tuple[str, str, str, str | None]:
    import triton

    return torch.__version__, triton.__version__, __version__, torch.version.cuda


def fingerprint_dict(info: DeviceInfo) -> dict:
    from ..switches import all_switches

    torch_v, triton_v, opselect_v, cuda_v = _software()
    return {"device": info.cache_key, "torch": torch_v, "triton": triton_v,
            "opselect": opselect_v, "cuda": cuda_v, "switches": all_switches()}


def current(info: DeviceInfo):
    from .records import Fingerprint

    return Fingerprint(**fingerprint_dict(info))
