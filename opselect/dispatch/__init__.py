"""Op and backend registry, the selection chain, signatures and shape buckets."""

from .backend import Backend, Estimate, TorchBackend
from .decision import Candidate, Decision
from .device import INTERPRETED, DeviceInfo, device_info
from .op import Call, Choice, Op, all_ops, get_op, register
from .signature import bucket
from .tuning_mode import measure, tuning

__all__ = ["Backend", "Call", "Candidate", "Choice", "Decision", "DeviceInfo", "Estimate",
           "INTERPRETED", "Op", "TorchBackend", "all_ops", "bucket", "device_info", "get_op",
           "measure", "register", "tuning"]
