"""Compile every Triton backend of every op for sm_90 (Hopper) without a GPU.

The interpreter accepts kernels the compiler rejects, so a green CPU test run does not prove that a
kernel compiles. This tool swaps Triton's driver for a stand-in that reports an sm_90 target, and
makes each launch compile instead of run: every backend's run() goes through its usual launcher,
the kernels are specialised on the call's real arguments, and ptxas (shipped with Triton) assembles
the result. It prints one line per compiled kernel (registers, spills, shared memory, the widest
global loads and stores) and exits non-zero if any kernel fails to compile.

    python tools/compile_check.py                 # every op (needs torch and triton, no GPU)
    python tools/compile_check.py isin topk       # some ops
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret (before triton is imported)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver, jit  # noqa: E402


class _Sm90:
    """Just enough of a driver for the JIT to specialise and compile for an H100/H200."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def __getattr__(self, name):
        raise AttributeError(name)


def _ptxas_report(ptx: str) -> str:
    # Triton 3.9 emits PTX 9.x, which its own `ptxas` (CUDA 12.9) rejects; the `ptxas-blackwell`
    # beside it (CUDA 13) assembles it, sm_90a included.
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = next((p for p in (bin_dir / "ptxas-blackwell", bin_dir / "ptxas") if p.exists()), None)
    if ptxas is None:
        return "ptxas not found"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    out = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    os.unlink(f.name)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"ptxas failed: {text[-2000:]}")
    regs = re.findall(r"Used (\d+) registers", text)
    spill = re.findall(r"(\d+) bytes spill stores", text)
    return f"regs={max(map(int, regs), default=0):3d} spill={max(map(int, spill), default=0)}"


COMPILED: list[str] = []

#: Calls at the edges of each op's plans, where the compiler has met different code than at the
#: calibration shapes (a size specialised to 1 folds loops away: triton 3.6's coalescing pass once
#: crashed on isin's search kernel with a one-element test set). Taken with --edges.
EDGES = {
    "isin": [([[1000], [n]], torch.float32, {}) for n in (1, 2, 3, 17, 100)],
    "topk": [([[r, n]], torch.float32, {"k": k})
             for r, n, k in ((1, 2, 1), (1, 100, 1), (3, 7, 3), (1, 256, 131), (64, 300, 1),
                             (1, 1, 1), (1, 5000, 64))],
    "softmax": [([[r, n]], torch.float32, {}) for r, n in ((1, 1), (3, 1), (1, 7), (5, 3000))]
               + [([[2, 3, 4]], torch.float32, {"dim": 1}),
                  ([[4, 100]], torch.bfloat16, {"out_dtype": "float64"})],
    "permute": [([[1, 3]], torch.float32, {"dims": [1, 0]}), ([[2, 1, 3]], torch.float32,
                                                                {"dims": [2, 1, 0]})],
}


def _install() -> None:
    stand_in = _Sm90()
    if hasattr(driver, "set_active"):
        driver.set_active(stand_in)
    else:  # older triton
        driver._active = stand_in
    original = jit.JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        ptx = kernel.asm["ptx"]
        widest = lambda kind: max(re.findall(rf"{kind}\.global[\.\w]*", ptx), key=len, default="-")  # noqa: E731
        consts = dict(kwargs)  # the constexprs (named as their plan fields) and the launch options
        COMPILED.append(f"{self.__name__:<28} {_ptxas_report(ptx)} smem={kernel.metadata.shared:6d} "
                        f"{widest('ld'):<18} {widest('st'):<18} {consts}")
        return kernel

    jit.JITFunction.run = compile_only


def main(argv: list[str]) -> int:
    """compile_check.py [op ...] [--edges] [--dtypes float16,bfloat16,...]: every Triton backend
    of each op on its calibration shapes; --edges adds EDGES; with --dtypes, every case again in
    each listed dtype (the compiler sees other types: 16-bit floats, 64-bit keys)."""
    extra: list[torch.dtype] = []
    edges = "--edges" in argv
    argv = [a for a in argv if a != "--edges"]
    if "--dtypes" in argv:
        i = argv.index("--dtypes")
        extra = [getattr(torch, name) for name in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:]
    _install()
    from opselect.dispatch import all_ops
    from opselect.errors import UnsupportedDType
    from opselect.kernels._common import Launcher

    Launcher.enabled = False  # every launch through JITFunction.run, which compiles here

    failures = 0
    for op in all_ops():
        if argv and op.name not in argv:
            continue
        cases = list(op.calibration) + (EDGES.get(op.name, []) if edges else [])
        cases += [(shapes, d, options) for shapes, _, options in cases if extra for d in extra]
        for shapes, dtype, options in cases:
            try:
                args, kwargs = op.sample(shapes, dtype, dict(options), torch.device("cpu"))
                call = op.prepare(*args, **kwargs)
                # Size grids and pick configs as for an H100/H200, not for this CPU.
                call.info = dataclasses.replace(call.info, sm_count=132, capability=(9, 0))
            except UnsupportedDType:
                continue  # a dtype from --dtypes this op does not take
            except Exception as exc:  # noqa: BLE001
                print(f"FAIL {op.name} {shapes} {dtype}: sample/prepare: {exc}")
                failures += 1
                continue
            for backend in op.backends:
                if not backend.uses_triton or backend.supports(call) is not None:
                    continue
                for cfg in backend.configs(call):
                    COMPILED.clear()
                    try:
                        backend.run(call, cfg)
                    except Exception as exc:  # noqa: BLE001 - report every failure, go on
                        failures += 1
                        print(f"FAIL {op.name}/{backend.name} {shapes} {str(dtype)[6:]} {cfg}: "
                              f"{type(exc).__name__}: {str(exc)[:3000]}")
                        continue
                    for line in COMPILED:
                        print(f"ok   {op.name}/{backend.name:<10} {line}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
