"""The tune cache's row keys: one tune record per (device, op, call key), one calibration per device."""

TUNE_PREFIX = "tune|"
CALIBRATION_PREFIX = "calibration|"


def tune_key(op: str, device: str, key: str) -> str:
    return f"{TUNE_PREFIX}{device}|{op}|{key}"


def calibration_key(device: str) -> str:
    return f"{CALIBRATION_PREFIX}{device}"
