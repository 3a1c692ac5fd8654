"""tools/compile_check.py on a machine without a GPU: what it would compile for permute (which has
no calibration shapes: the tool's own CALLS), every kernel of every permute backend among it.
Compiling needs Triton's compiler without the interpreter (run the tool itself for that); here
its runs are listed (--list), the launches skipped."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from opselect.dispatch import get_op
from opselect.kernels._common import Launcher

TOOL = Path(__file__).resolve().parent.parent / "tools" / "compile_check.py"


def _tool():
    spec = importlib.util.spec_from_file_location("compile_check", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up there)
    spec.loader.exec_module(module)
    return module


def test_importing_the_tool_keeps_this_process_interpreted():
    # (the tool drops TRITON_INTERPRET as a program only: tests spawn interpreted children)
    before = os.environ.get("TRITON_INTERPRET")
    _tool()
    assert os.environ.get("TRITON_INTERPRET") == before


def test_it_would_compile_every_kernel_of_every_permute_backend(cpu_triton, capsys):
    tool = _tool()
    assert tool.main(["--list", "permute"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "0 failure(s)"
    listed: dict[str, set[str]] = {}
    for line in lines[:-1]:
        status, where, kernel = line.split()[:3]
        assert status == "ok", line
        listed.setdefault(where.split("/")[1], set()).add(kernel)
    # Each backend's kernels: those its module holds a Launcher of.
    held = {b.name: {v.fn.__name__ for v in vars(__import__(type(b).__module__, fromlist=["_"]))
                     .values() if isinstance(v, Launcher)}
            for b in get_op("permute").backends if b.uses_triton}
    assert listed == held == {"naive": {"_naive_kernel"}, "vectorized": {"_runs_kernel"},
                              "tiled": {"_tiled_kernel", "_narrow_kernel"}}
    assert Launcher.__call__.__name__ == "__call__" and Launcher.enabled  # (put back)


def test_a_listed_run_is_its_kernels_specs(cpu_triton):
    # The constexprs listed are the ones the launch would compile with: the plan's.
    tool = _tool()
    run = next(r for r in tool.runs(["permute"]) if r.backend.name == "tiled")
    [(kernel, grid, constexprs)] = tool.launched(run)
    plan = run.backend.plan(run.call, run.config)
    assert kernel == ("_narrow_kernel" if plan.narrow else "_tiled_kernel")
    assert grid == plan.grid and constexprs["num_warps"] == plan.launch.num_warps
