"""Compile every Triton backend of every op for sm_90 (Hopper) without a GPU.

The interpreter accepts kernels the compiler rejects, so a green CPU test run does not prove that a
kernel compiles. This tool swaps Triton's driver for a stand-in that reports an sm_90 target, and
makes each launch compile instead of run: every backend's run() goes through its usual launcher,
the kernels are specialised on the call's real arguments, and ptxas (shipped with Triton) assembles
the result. It prints one line per compiled kernel (registers, spills, shared memory, the widest
global loads and stores) and exits non-zero if any kernel fails to compile.

    python tools/compile_check.py                 # every op (needs torch and triton, no GPU)
    python tools/compile_check.py isin topk       # some ops
    python tools/compile_check.py --list permute  # what it would compile, compiling nothing

Run it under the oldest Triton the package takes as well (3.6, the lent GPU's): a kernel 3.9
compiles may not compile there (3.6 takes a bfloat16 max in float32, so a reduction's combine
that does not cast back fails its verifier). A second environment does it:

    python -m venv /tmp/v36 && /tmp/v36/bin/pip install torch==2.13.0 triton==3.6.0 numpy
    PYTHONPATH=$PWD /tmp/v36/bin/python tools/compile_check.py topk
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

if __name__ == "__main__":
    # Compile, do not interpret (before triton is imported). Only as a program: a test that
    # imports this module keeps its process's interpreter (and its children's).
    os.environ.pop("TRITON_INTERPRET", None)
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

#: Calls of ops that have no calibration shapes (permute's cost model fits no device constants):
#: between them they reach every kernel of the op's backends with the layouts real programs
#: permute. permute: a square transpose (naive, tiled's square tile), attention heads moved
#: past the sequence (vectorized's runs), NCHW <-> NHWC of 3 channels (tiled's narrow kernel,
#: either side), 16-byte elements (2 units a lane), an input that is itself a permuted view,
#: and sizes of no power of two (masked tile edges).
CALLS = {
    "permute": [([[2048, 2048]], torch.float32, {"dims": [1, 0]}),
                ([[4, 512, 16, 64]], torch.float16, {"dims": [0, 2, 1, 3]}),
                ([[32, 3, 224, 224]], torch.uint8, {"dims": [0, 2, 3, 1]}),
                ([[32, 224, 224, 3]], torch.uint8, {"dims": [0, 3, 1, 2]}),
                ([[1024, 1024]], torch.complex128, {"dims": [1, 0]}),
                ([[8, 64, 64, 64]], torch.bfloat16, {"dims": [0, 3, 2, 1], "layout": "permuted",
                                                      "layout_dims": [0, 2, 1, 3]}),
                ([[1000, 3000]], torch.int8, {"dims": [1, 0]})],
}

#: Calls at the edges of each op's plans, where the compiler has met different code than at the
#: calibration shapes (a size specialised to 1 folds loops away: triton 3.6's coalescing pass once
#: crashed on isin's search kernel with a one-element test set). Taken with --edges.
EDGES = {
    "isin": [([[1000], [n]], torch.float32, {}) for n in (1, 2, 3, 17, 100)],
    "topk": [([[r, n]], torch.float32, {"k": k})
             for r, n, k in ((1, 2, 1), (1, 100, 1), (3, 7, 3), (1, 256, 131), (64, 300, 1),
                             (1, 1, 1), (1, 5000, 64))]
            # rows off the 16-byte grid (maxima reads them in shifted vectors)
            + [([[4, 50257]], torch.float16, {"k": 50}), ([[8, 1001]], torch.bfloat16, {"k": 1}),
               ([[8, 1001]], torch.int64, {"k": 3}),
               # argmax: rows of one program (shifted vectors), shared rows, short rows
               ([[1024, 50257]], torch.float16, {"k": 1}), ([[16, 128000]], torch.bfloat16,
                                                             {"k": 1}),
               ([[5, 1001]], torch.float64, {"k": 1}), ([[4096, 7]], torch.int8, {"k": 1})],
    "softmax": [([[r, n]], torch.float32, {}) for r, n in ((1, 1), (3, 1), (1, 7), (5, 3000))]
               + [([[2, 3, 4]], torch.float32, {"dim": 1}),
                  ([[4, 100]], torch.bfloat16, {"out_dtype": "float64"}),
                  # rows off the 16-byte grid: cooperative and multirow (shifted vectors),
                  # fused (element by element)
                  ([[4, 50257]], torch.bfloat16, {}), ([[6, 1001]], torch.float16, {}),
                  ([[64, 37]], torch.float16, {}),
                  # rows of a transposed matrix: strided reads them in place as its columns
                  ([[64, 3000]], torch.float16, {"transposed": True}),
                  ([[5, 7, 300]], torch.float32, {"transposed": True}),
                  # few long columns: strided's split configs (the dim over programs too)
                  ([[64, 32000]], torch.bfloat16, {"transposed": True}),
                  ([[2, 8192, 3]], torch.float64, {"dim": 1})],
    "permute": [([[1, 3]], torch.float32, {"dims": [1, 0]}), ([[2, 1, 3]], torch.float32,
                                                                {"dims": [2, 1, 0]})],
}


def _width(access: str) -> int:
    """Bits one global access moves (ld.global.v4.b32: 128), for the widest one a kernel has."""
    lanes = re.search(r"\.v(\d)", access)
    bits = re.search(r"\.[bfsu](\d+)\b", access)
    return (int(lanes.group(1)) if lanes else 1) * (int(bits.group(1)) if bits else 0)


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
        widest = lambda kind: max(re.findall(rf"{kind}\.global[\.\w:]*", ptx), key=_width, default="-")  # noqa: E731
        consts = dict(kwargs)  # the constexprs (named as their plan fields) and the launch options
        COMPILED.append(f"{self.__name__:<28} {_ptxas_report(ptx)} smem={kernel.metadata.shared:6d} "
                        f"{widest('ld'):<18} {widest('st'):<18} {consts}")
        return kernel

    jit.JITFunction.run = compile_only


@dataclasses.dataclass
class Run:
    """One run of a backend that compiles its kernels: a case of an op, prepared as a call on
    an H100/H200, under one of the backend's configs; or a case that could not be prepared
    (backend None, `error` says why)."""

    op: str
    shapes: list
    dtype: torch.dtype
    backend: Any = None
    call: Any = None
    config: dict | None = None
    error: str | None = None


def cases(op, edges: bool = False, extra: tuple = ()) -> list[tuple]:
    """(shapes, dtype, options) of the calls compiled for an op: its calibration shapes (or
    CALLS where it has none), EDGES with --edges, and each of them again in every --dtypes
    dtype."""
    found = list(op.calibration) + CALLS.get(op.name, []) + (
        EDGES.get(op.name, []) if edges else [])
    return found + [(shapes, d, options) for shapes, _, options in found for d in extra]


def runs(names: list[str], edges: bool = False, extra: tuple = ()) -> Iterator[Run]:
    """Every run main() compiles, in order: per op (all, or those named) and case, each Triton
    backend that takes the case's call, with each of its configs. One call at a time is made
    (its tensors live while its runs do)."""
    from opselect.dispatch import all_ops
    from opselect.errors import UnsupportedDType

    for op in all_ops():
        if names and op.name not in names:
            continue
        for shapes, dtype, options in cases(op, edges, extra):
            try:
                args, kwargs = op.sample(shapes, dtype, dict(options), torch.device("cpu"))
                call = op.prepare(*args, **kwargs)
                # Size grids and pick configs as for an H100/H200, not for this CPU.
                call.info = dataclasses.replace(call.info, sm_count=132, capability=(9, 0))
            except UnsupportedDType:
                continue  # a dtype from --dtypes this op does not take
            except Exception as exc:  # noqa: BLE001
                yield Run(op.name, shapes, dtype, error=f"sample/prepare: {exc}")
                continue
            for backend in op.backends:
                if not backend.uses_triton or backend.supports(call) is not None:
                    continue
                for cfg in backend.configs(call):
                    yield Run(op.name, shapes, dtype, backend, call, cfg)


def launched(run: Run) -> list[tuple[str, tuple, dict]]:
    """(kernel, grid, constexprs) of each launch the run makes, the launches themselves
    skipped: what main() would compile for it, on any machine (no driver, no ptxas)."""
    from opselect.kernels._common import Launcher

    seen: list[tuple[str, tuple, dict]] = []
    real_call, real_enabled = Launcher.__call__, Launcher.enabled

    def record(self, spec, grid, args, constexprs=None):
        seen.append((self.fn.__name__, tuple(grid), self._constexprs(spec, constexprs)))

    Launcher.__call__, Launcher.enabled = record, False  # (bound launches go through __call__)
    try:
        run.backend.run(run.call, run.config)
    finally:
        Launcher.__call__, Launcher.enabled = real_call, real_enabled
    return seen


def main(argv: list[str]) -> int:
    """compile_check.py [op ...] [--edges] [--dtypes float16,bfloat16,...] [--list]: every
    Triton backend of each op on its calibration shapes (CALLS where it has none); --edges adds
    EDGES; with --dtypes, every case again in each listed dtype (the compiler sees other types:
    16-bit floats, 64-bit keys); --list prints each kernel a run would compile, with its grid
    and constexprs, and compiles nothing."""
    extra: list[torch.dtype] = []
    edges, listing = "--edges" in argv, "--list" in argv
    argv = [a for a in argv if a not in ("--edges", "--list")]
    if "--dtypes" in argv:
        i = argv.index("--dtypes")
        extra = [getattr(torch, name) for name in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:]
    if not listing:
        _install()
        from opselect.kernels._common import Launcher

        Launcher.enabled = False  # every launch through JITFunction.run, which compiles here

    failures = 0
    for run in runs(argv, edges, tuple(extra)):
        if run.backend is None:
            print(f"FAIL {run.op} {run.shapes} {run.dtype}: {run.error}")
            failures += 1
            continue
        COMPILED.clear()
        try:
            if listing:
                COMPILED.extend(f"{kernel:<28} grid={grid} {consts}"
                                for kernel, grid, consts in launched(run))
            else:
                run.backend.run(run.call, run.config)
        except Exception as exc:  # noqa: BLE001 - report every failure, go on
            failures += 1
            print(f"FAIL {run.op}/{run.backend.name} {run.shapes} {str(run.dtype)[6:]} "
                  f"{run.config}: {type(exc).__name__}: {str(exc)[:3000]}")
            continue
        for line in COMPILED:
            print(f"ok   {run.op}/{run.backend.name:<10} {line}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
