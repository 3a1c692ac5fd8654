"""What softmax's two cost models share: torch's (softmax_torch.py) and the Triton backends'
(softmax.py). Seconds throughout; see softmax.py's docstring for the parts and their names."""

from __future__ import annotations

SATURATING_FRACTION = 0.6  # of the SMs, each running one large program, that saturate DRAM
#: Fraction of L2 that re-reads can count on (the rest holds other traffic and the output).
L2_USABLE = 0.5
#: Host seconds of the autograd engine's own work under grad, the same whichever backend ran, so
#: charged to every one: under max(host, device) a shared host term still decides between host-
#: and device-bound calls (fits/softmax.md, "AUTOGRAD_HOST").
AUTOGRAD_ENGINE_HOST = 40e-6


def op_name(call) -> str:
    return "log_softmax" if call.log else "softmax"


def busy(model, programs: float) -> float:
    """Fraction of DRAM bandwidth reachable with this many concurrently running programs."""
    return min(1.0, max(programs, 1) / (SATURATING_FRACTION * model.sm_count))


def torch_launch(model) -> float:
    return getattr(model, "torch_launch", model.launch)


def input_copy(call, model, itemsize: int) -> float:
    """Device seconds of torch's contiguous copy of the call's input (elements of itemsize): it
    transposes where the last dim is not contiguous (DeviceModel.contiguous_copy)."""
    x = call.x
    rows_stay = x.dim() == 0 or x.shape[-1] == 1 or x.stride(-1) == 1
    return model.contiguous_copy(call.numel, itemsize, transposing=not rows_stay)
