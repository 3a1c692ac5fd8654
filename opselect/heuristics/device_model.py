"""Per-device constants of the cost model: defaults per GPU, overridden by `opselect calibrate`.

Every constant is a throughput or a latency measured the way the cost functions use it:

    bandwidth        bytes/s a large device-to-device copy moves, counting read + write
    l2_bandwidth     bytes/s of streaming traffic that stays in L2
    launch           host seconds one Triton kernel launch costs (Python launcher + driver)
    torch_launch     host seconds one ATen op costs (its dispatcher + driver)
    sync             seconds one host<->device synchronisation adds (a .item() on idle stream)
    gather_l2        seconds per random 4-8 byte load served by L2, whole chip (a throughput)
    gather_dram      seconds per random load that misses L2 (one DRAM sector each)
    gather_smem      seconds per random lookup in shared memory / registers, whole chip
    atomic           seconds per atomic read-modify-write on a global address, whole chip
    compare          seconds per element-pair comparison in a fused compare kernel
    sort_per_byte    seconds per byte per radix pass of torch.sort (keys + values)
    sort_fixed       seconds of fixed overhead of one torch.sort call

`scales` hold per "op/backend" corrections (measured over predicted time) fitted by calibrate.

The measurements behind the defaults and the scale rule are kept in
benchmarks/results/h200/fits/device_model.md, named by heading below.
"""

from __future__ import annotations

import math
from typing import Any
from dataclasses import dataclass, field, fields, replace

from ..dispatch import op as _dispatch_op
from ..dispatch.backend import Estimate
from ..dispatch.device import DeviceInfo

CONSTANT_NAMES = ("bandwidth", "l2_bandwidth", "launch", "torch_launch", "sync", "gather_l2",
                  "gather_dram", "gather_smem", "atomic", "compare", "sort_per_byte", "sort_fixed")


@dataclass(frozen=True)
class DeviceModel:
    name: str
    sm_count: int
    l2_bytes: int
    smem_bytes: int  # usable shared memory per block
    bandwidth: float
    l2_bandwidth: float
    launch: float
    torch_launch: float
    sync: float
    gather_l2: float
    gather_dram: float
    gather_smem: float
    atomic: float
    compare: float
    sort_per_byte: float
    sort_fixed: float
    #: Triton kernels under the interpreter are this many times slower than the roofline says.
    triton_slowdown: float = 1.0
    scales: dict[str, float] = field(default_factory=dict)
    calibrated: bool = False

    # -- helpers used by the cost functions -------------------------------------------------------
    def stream(self, nbytes: float) -> float:
        """Time to stream nbytes through DRAM (reads and writes counted alike)."""
        return nbytes / self.bandwidth

    def contiguous_copy(self, numel: int, itemsize: int, *, transposing: bool) -> float:
        """torch's .contiguous() of numel elements: their bytes streamed in and out, or, where the
        copy transposes (the output's rows are elements lying apart in the input: x.t()), the
        longer of that and TRANSPOSE_ELEMENTS_PER_SM_S: neither its reads nor its writes then run
        along lines."""
        streamed = self.stream(2 * numel * itemsize)
        if not transposing:
            return streamed
        return max(streamed, numel / (TRANSPOSE_ELEMENTS_PER_SM_S * self.sm_count))

    def gather(self, n: float, table_bytes: float, *, on_chip: bool = False) -> float:
        """n random loads from a table of table_bytes: on chip, from L2 if it fits, else DRAM."""
        if on_chip:
            return n * self.gather_smem
        if table_bytes <= 0.6 * self.l2_bytes:
            return n * self.gather_l2
        # Partly cached: the hit rate falls as the table outgrows L2.
        hit = min(1.0, 0.6 * self.l2_bytes / table_bytes)
        return n * (hit * self.gather_l2 + (1 - hit) * self.gather_dram)

    def sort(self, n: float, key_bytes: int, value_bytes: int = 0) -> float:
        """torch.sort of n keys (with values), a radix sort of ceil(bits / 8) passes."""
        if n <= 1:
            return self.launch
        passes = key_bytes  # 8-bit digits
        return self.sort_fixed + passes * 3 * n * (key_bytes + value_bytes) * self.sort_per_byte

    def estimate(self, op: str, backend: str, *, triton: bool, notes: tuple[str, ...] = (),
                 **parts: float) -> Estimate:
        """Combine the parts, then apply the calibrated correction of this backend and, for
        Triton kernels run by the interpreter, the interpreter's slowdown.

        The part named `launch` is host time; the host queues work while the device runs, so a
        call takes the longer of the two, not their sum (small calls are launch-bound, large ones
        device-bound).

        A calibrated scale corrects the device parts only: it is measured on device-bound calls
        (bench_random's fit, `opselect calibrate`), so it says nothing of the host time, and laid
        over the host time as well it would move every small call of a backend whose large calls
        ran slower than modelled (fits/device_model.md, "Calibrated scales: device parts
        only")."""
        scale = self.scales.get(f"{op}/{backend}", 1.0)
        slow = 1.0
        if triton and self.triton_slowdown != 1.0:
            slow = self.triton_slowdown  # the interpreter runs the host's share as well
            notes = (*notes, "interpreted")
        if scale != 1.0 or slow != 1.0:
            parts = {k: v * slow * (1.0 if k == "launch" else scale) for k, v in parts.items()}
        host = parts.get("launch", 0.0)
        device = sum(v for k, v in parts.items() if k != "launch")
        return Estimate(max(host, device), dict(parts), notes)


# Defaults: the H200's constants as `opselect calibrate` measured them on an H200 (the run and
# its versions: fits/device_model.md, "Defaults"); the H100 shares the chip, with slower memory;
# the A100's are datasheet estimates. `opselect calibrate` replaces them with your machine's.
_HOPPER = dict(
    smem_bytes=227 * 1024, launch=14e-6, torch_launch=8.7e-6, sync=21e-6, gather_l2=5.6e-12,
    gather_smem=4.2e-13, atomic=1.4e-11, compare=1.06e-13, sort_fixed=14e-6,
)
_KNOWN = {
    "H200": dict(_HOPPER, bandwidth=4.1e12, l2_bandwidth=9e12, gather_dram=2.4e-11,
                 sort_per_byte=3.3e-13),
    "H100": dict(_HOPPER, bandwidth=3.0e12, l2_bandwidth=8e12, gather_dram=3.4e-11,
                 sort_per_byte=4.5e-13),
    "A100": dict(smem_bytes=163 * 1024, launch=16e-6, torch_launch=9e-6, sync=25e-6,
                 gather_smem=8e-13, atomic=2.5e-11, compare=2e-13, sort_fixed=20e-6,
                 bandwidth=1.6e12, l2_bandwidth=4e12, gather_l2=1.1e-11, gather_dram=4.5e-11,
                 sort_per_byte=8e-13),
}


#: The GPUs the model knows by name (for what-if questions about a GPU one does not have):
#: full name, compute capability, SM count, L2 bytes, memory bytes.
KNOWN_GPUS = {
    "H200": ("NVIDIA H200", (9, 0), 132, 60 << 20, 141 << 30),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 132, 50 << 20, 80 << 30),
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0), 108, 40 << 20, 80 << 30),
}


def known_gpu(tag: str) -> DeviceInfo:
    """The DeviceInfo of a GPU of KNOWN_GPUS by its tag (H200, h100, ...)."""
    from ..errors import UsageError

    spec = KNOWN_GPUS.get(tag.upper())
    if spec is None:
        raise UsageError(f"unknown GPU {tag!r}; known: {', '.join(KNOWN_GPUS)}")
    name, capability, sms, l2, memory = spec
    return DeviceInfo("cuda", 0, name, capability, sms, l2, memory)


#: Elements a second, per SM, of torch's copy where it transposes (x.t().contiguous()): 127e9-
#: 149e9 elements a second on the H200 in float16, bfloat16 and float32 alike, where the bytes
#: at the copy bandwidth say 4-8 times less time (fits/softmax.md, "A transposing copy").
TRANSPOSE_ELEMENTS_PER_SM_S = 1.06e9

#: Host seconds of one launch through a bound Launcher (kernels/_common.py): the compiled kernel
#: called directly, about a third of Triton's own launch path (`launch`).
BOUND_LAUNCH = 5e-6
#: Host seconds of one output or workspace allocation through a prepared allocator
#: (kernels/_common.allocator: torch.empty with its sizes bound), 2.0 us on the H200's host
#: (benchmarks/host_parts.py); not an ATen op with a kernel (`torch_launch`).
ALLOCATION = 2e-6


def defaults_for(info: DeviceInfo) -> DeviceModel:
    if info.type != "cuda":
        # The CPU: torch's kernels at a few GB/s; Triton only through the interpreter, which is
        # about a thousand times slower than a GPU would be, so auto picks torch there.
        return DeviceModel(
            name=info.cache_key, sm_count=info.sm_count, l2_bytes=info.l2_bytes, smem_bytes=1 << 16,
            bandwidth=8e9, l2_bandwidth=3e10, launch=2e-6, torch_launch=2e-6, sync=0.0,
            gather_l2=1 / 5e8, gather_dram=1 / 1e8, gather_smem=1 / 1e9, atomic=1 / 1e8, compare=1 / 4e9,
            sort_per_byte=1 / 2e9, sort_fixed=5e-6, triton_slowdown=1e3)
    for tag, consts in _KNOWN.items():
        if tag in info.name.upper():
            return DeviceModel(name=info.name, sm_count=info.sm_count, l2_bytes=info.l2_bytes,
                               **consts)
    # An unknown GPU: scale an H100's figures by its SM count; calibrate to do better.
    ratio = info.sm_count / 132
    base = _KNOWN["H100"]
    return DeviceModel(
        name=info.name, sm_count=info.sm_count, l2_bytes=info.l2_bytes,
        **{k: (v * ratio if k in ("bandwidth", "l2_bandwidth") else
               v / ratio if k.startswith(("gather", "atomic", "compare", "sort_per")) else v)
           for k, v in base.items()})


_models: dict[str, DeviceModel] = {}


def model_for(info: DeviceInfo) -> DeviceModel:
    """The device's model: defaults, with the calibration from the tune cache laid over them."""
    model = _models.get(info.cache_key)
    if model is None:
        model = defaults_for(info)
        if info.type == "cuda":
            from ..tune_cache import store

            record = store().get_calibration(info)
            if record is not None:
                model = with_calibration(model, record.constants, record.scales)
        _models[info.cache_key] = model
    return model


def with_calibration(model: DeviceModel, constants: dict[str, float],
                     scales: dict[str, float]) -> DeviceModel:
    known = {f.name for f in fields(DeviceModel)}
    good = {k: float(v) for k, v in constants.items()
            if k in known and k in CONSTANT_NAMES and math.isfinite(v) and v > 0}
    good_scales = {k: float(v) for k, v in scales.items() if math.isfinite(v) and v > 0}
    return replace(model, **good, scales={**model.scales, **good_scales}, calibrated=True)


def forget_models() -> None:
    _models.clear()


def what_if(op: Any, shapes: Any, dtype: Any, options: dict, gpu: str) -> Any:
    """The cost model's decision (a Decision) of `op` for a call described as a warm spec entry
    (shapes, dtype, options) on a known GPU one need not have (`opselect explain --what-if`,
    the demo)."""
    import torch

    from ..errors import OpselectError, UsageError

    info = known_gpu(gpu)
    try:
        args, kwargs = op.sample(shapes, dtype, dict(options), torch.device("meta"))
        call = op.prepare(*args, **kwargs)
    except OpselectError as exc:
        raise UsageError(f"{op.name} {shapes} {dtype}: {exc}") from None
    except (RuntimeError, ValueError, TypeError) as exc:  # the options or torch refused
        raise UsageError(f"{op.name} {shapes} {dtype} {options}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0]}") from None
    return op.what_if(call, info)


# Dispatch asks for the model through these (it sits below the heuristics).
_dispatch_op.use_device_models(model_for, defaults_for)
