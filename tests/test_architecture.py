"""The shape of the code: no import circles, modules of a readable size, every error class in
errors.py, and tune-cache source hashes that cover every line a backend runs.

The hash tests guard a correctness property of the cache: a timing is trusted only while the code
that was timed is unchanged, so a kernel that reaches a jit function outside its backend's hash
would keep stale timings trusted after an edit.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opselect
from opselect.dispatch.backend import Backend
from opselect.dispatch.op import all_ops
from opselect.dispatch.source_hash import backend_roots, closure, qualified_name
from opselect.kernels._common import Launcher

PACKAGE = Path(opselect.__file__).resolve().parent
#: A module of opselect/ stays under this many lines; a kernels/ module (a backend's kernels, its
#: plan and its launches together) under KERNEL_MODULE_LINES.
MAX_MODULE_LINES = 500
KERNEL_MODULE_LINES = 700


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """module -> the opselect modules it imports, counting imports inside functions too (a
    lazy import that closes a circle is still a circle: it only moves the failure to a call)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = name.split(".") if is_package else name.split(".")[:-1]
                if node.level:
                    base = base[:len(base) - (node.level - 1)]
                    where = ".".join(base + ([node.module] if node.module else []))
                else:
                    where = node.module or ""
                for alias in node.names:
                    sub = f"{where}.{alias.name}"
                    targets.append(sub if sub in modules else where)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    graph = _import_graph()
    circles = _cycles(graph)
    detail = [{m: sorted(graph[m] & set(c)) for m in c} for c in circles]
    assert not circles, f"import circles in opselect/: {detail}"


#: The layers of opselect/, lowest first: a module imports modules of its own layer and those
#: below, never above (imports inside functions count). A module is in the layer of the longest
#: prefix that names it; a module no prefix names is at the top (the package, the command line,
#: warm, distributed, demo ...), as are the entry points listed in TOP.
LAYERS = (
    # what everything stands on: errors, switches, the device and decision records, the tuning
    # switch, routing's thread state, the usage counts, decision hooks, the kernel launcher
    ("opselect.errors", "opselect.switches", "opselect._version", "opselect.dispatch.device",
     "opselect.dispatch.tuning_mode", "opselect.dispatch.decision", "opselect.dispatch.signature",
     "opselect.routing_state", "opselect.usage", "opselect.observe", "opselect.kernels._common"),
    ("opselect.tune_cache",),
    ("opselect.dispatch",),
    ("opselect.heuristics",),
    ("opselect.kernels",),
    ("opselect.library", "opselect.transforms"),
    ("opselect.fronts",),
    ("opselect.ops", "opselect.routing"),
)
#: Modules inside a lower package that are programs of their own: the isolation helper's main
#: (it imports the whole package) and the calibration command (it times a kernel of isin).
TOP = ("opselect.dispatch.isolation_child", "opselect.heuristics.calibrate")


def _layer(module: str) -> int:
    if module in TOP:
        return len(LAYERS)
    best, found = -1, len(LAYERS)
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), level
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted((m, d) for m, deps in _import_graph().items() for d in deps
                    if _layer(d) > _layer(m))
    assert not upward, f"imports of a higher layer (module, imported): {upward}"


def test_the_layer_check_sees_an_upward_import():
    assert _layer("opselect.dispatch.op") < _layer("opselect.heuristics.device_model")
    assert _layer("opselect.kernels._common") < _layer("opselect.dispatch.source_hash")
    assert _layer("opselect.fronts.isin") < _layer("opselect.routing") < _layer("opselect.cli")


def test_the_graph_check_sees_a_circle():
    # The check itself must be able to fail: a planted two-module circle is found.
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_modules_stay_readable():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > (
                KERNEL_MODULE_LINES if name.startswith("opselect.kernels.") else MAX_MODULE_LINES)}
    assert not long, (f"modules over {MAX_MODULE_LINES} lines ({KERNEL_MODULE_LINES} in "
                      f"kernels/): {long}")


def test_every_op_of_opselect_has_a_front():
    """Each op a kernels/<op> package registers answers through its front, fronts/<op>.py: the
    public function tuning times (Op.public) and the entry points enable() takes over live there,
    and no op's code sits in the cross-op modules."""
    from opselect import routing

    ours = [op for op in all_ops() if op.prepare.__module__.startswith("opselect.kernels.")]
    assert {op.name for op in ours} >= {"isin", "topk", "permute", "softmax", "log_softmax"}
    for op in ours:
        package = op.prepare.__module__.split(".")[2]
        front = f"opselect.fronts.{package}"
        assert op.public is not None and op.public.__module__ == front, (op.name, op.public)
        assert any(entry[0] == op.name for entry in getattr(sys.modules[front], "ENTRY_POINTS")), \
            f"{op.name}: no entry point in {front}"
    for entry in routing._ENTRY_POINTS:
        handler = entry[3]
        assert handler.__module__.startswith("opselect.fronts."), entry
    for shared in ("ops", "library", "transforms", "routing"):
        source = _modules()[f"opselect.{shared}"].read_text()
        assert "opselect.kernels" not in source and "from .kernels" not in source, \
            f"opselect/{shared}.py imports an op's kernels: that belongs in the op's front"


def _autograd_functions(module, source: str) -> list[str]:
    """The torch.autograd.Function subclasses a module's source defines: its module-level
    classes judged by what they are, a class made inside a function (not an attribute of the
    module) by its bases' names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        made = getattr(module, node.name, None)
        if isinstance(made, type):
            if issubclass(made, torch.autograd.Function):
                found.append(node.name)
        elif any(ast.unparse(b).split(".")[-1] == "Function" for b in node.bases):
            found.append(node.name)
    return found


def test_each_front_has_one_autograd_function():
    """One autograd.Function per op (issue 34): the same class is the library op's Autograd
    kernel (compiled graphs) and what an eager call under a transform goes through, so its
    backward, jvp and vmap rules are written once. softmax's serves log_softmax too."""
    fronts = {name: path for name, path in _modules().items()
              if name.startswith("opselect.fronts.") and not name.startswith("opselect.fronts._")}
    assert {"opselect.fronts.isin", "opselect.fronts.topk", "opselect.fronts.permute",
            "opselect.fronts.softmax"} <= set(fronts)
    counts = {name: _autograd_functions(importlib.import_module(name), path.read_text())
              for name, path in sorted(fronts.items())}
    assert all(len(found) == 1 for found in counts.values()), \
        f"fronts with other than one autograd.Function: {counts}"


def test_the_function_count_sees_a_second_function():
    # The check itself must be able to fail: two planted Functions, one made in a function.
    source = ("import torch\nclass _A(torch.autograd.Function):\n    pass\n"
              "def make():\n    class _B(torch.autograd.Function):\n        pass\n")
    module = type(sys)("planted")
    exec(compile(source, "planted", "exec"), module.__dict__)
    assert _autograd_functions(module, source) == ["_A", "_B"]


def test_every_exception_class_lives_in_errors():
    elsewhere = []
    for name, path in _modules().items():
        if name == "opselect.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    re.search(r"(Error|Exception|Warning)$", ast.unparse(b)) for b in node.bases):
                elsewhere.append(f"{name}.{node.name}")
    assert not elsewhere, f"exception classes outside opselect/errors.py: {elsewhere}"


# -- one way to run a backend -----------------------------------------------------------------------
def _kernel_backend_classes() -> set[type]:
    """Every backend class a module under opselect/kernels defines or mixes in (each module
    imported first: a backend not registered in an op yet counts too)."""
    import pkgutil

    import opselect.kernels

    for info in pkgutil.walk_packages(opselect.kernels.__path__, "opselect.kernels."):
        importlib.import_module(info.name)
    found = set()
    for name, module in list(sys.modules.items()):
        if name.startswith("opselect.kernels.") and module is not None:
            found.update(v for v in vars(module).values()
                         if isinstance(v, type) and issubclass(v, Backend))
    return found


def test_no_backend_of_the_kernels_writes_its_own_run():
    """Backend.run is the one way a call reaches a backend (an empty call answered by the call,
    then the plan and _launch(plan, call)): a backend says what it does in _launch, never in a
    run of its own, where an empty call or a config could take a way of its own."""
    classes = _kernel_backend_classes()
    assert len(classes) >= 15, classes  # (the walk found the backends)
    own_run = sorted({f"{klass.__module__}.{klass.__qualname__}" for cls in classes
                      for klass in cls.__mro__
                      if klass.__module__.startswith("opselect.kernels.") and "run" in vars(klass)})
    assert not own_run, f"backend classes with a run() of their own (write _launch): {own_run}"
    # (opselect's ops: a test's own op may write run, as a user's backend still may)
    ours = [op for op in all_ops() if op.prepare.__module__.startswith("opselect.kernels.")]
    assert {op.name for op in ours} >= {"isin", "topk", "permute", "softmax", "log_softmax",
                                         "matmul", "linear"}
    for op in ours:
        for backend in op.backends[1:]:  # (torch's op answers every call itself: TorchBackend)
            assert type(backend).run is Backend.run, (op.name, backend.name)
            assert type(backend)._launch is not Backend._launch, (op.name, backend.name)


def _empty_calls():
    """(op, args, kwargs, torch's answer) of calls with nothing to compute: no elements, k = 0,
    an empty dim, a 0-d input with k = 0, out= where the op takes it, autograd."""
    e, t = torch.empty(0, 4, dtype=torch.int64), torch.arange(3)
    yield "isin", (e, t), {"invert": True}, lambda: torch.isin(e, t, invert=True)
    out = torch.empty(0, dtype=torch.bool)  # resized to the elements' shape, as torch does
    yield "isin", (e, t), {"out": out}, lambda: torch.isin(e, t)
    x = torch.randn(6, 0, 5)
    yield "topk", (x, 0), {"dim": 0}, lambda: torch.topk(x, 0, 0)
    grad = torch.randn(0, 9, requires_grad=True)
    yield "topk", (grad, 2), {"largest": False}, lambda: torch.topk(grad, 2, largest=False)
    scalar = torch.tensor(1.5)
    yield "topk", (scalar, 0), {}, lambda: torch.topk(scalar, 0)
    p = torch.randn(2, 0, 3)
    yield "permute", (p, (2, 0, 1)), {}, lambda: p.permute(2, 0, 1).contiguous()
    p_out = torch.empty(0)
    yield "permute", (p, (2, 0, 1)), {"out": p_out}, lambda: p.permute(2, 0, 1).contiguous()
    h = torch.randn(3, 0, 5, dtype=torch.float16, requires_grad=True)
    yield "softmax", (h, 1), {"dtype": torch.float32}, lambda: torch.softmax(h, 1,
                                                                             dtype=torch.float32)
    yield "log_softmax", (torch.randn(0, 7), -1), {}, lambda: torch.empty(0, 7)
    ma, mb = torch.randn(2, 0, 4), torch.randn(4, 3)
    yield "matmul", (ma, mb), {}, lambda: torch.matmul(ma, mb)
    ka, kb = torch.randn(3, 0, dtype=torch.float16), torch.randn(0, 5, dtype=torch.float16)
    yield "matmul", (ka, kb), {}, lambda: torch.matmul(ka, kb)  # k = 0: zeros
    lx, lw, lb = torch.randn(4, 0), torch.randn(5, 0), torch.randn(5)
    yield "linear", (lx, lw, lb), {}, lambda: torch.nn.functional.linear(lx, lw, lb)  # the bias


def test_an_empty_call_reaches_no_plan_and_no_launch(cpu_triton, monkeypatch):
    """Every backend, forced, answers an empty call as torch does (shapes, dtypes, out=,
    autograd) with the call's own empty_result: no backend makes a plan for it (its arithmetic
    may divide by the empty size) or reaches its _launch, and no kernel is launched."""
    def refused(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__} planned or launched an empty call")

    ops = {op.name: op for op in all_ops() if op.prepare.__module__.startswith("opselect.kernels.")}
    launched: list = []
    monkeypatch.setattr(Launcher, "observer", launched.append)
    for op in ops.values():
        for backend in op.backends[1:]:
            monkeypatch.setattr(type(backend), "_launch", refused)
            monkeypatch.setattr(type(backend), "plan", refused)
    seen = set()
    for name, args, kwargs, reference in _empty_calls():
        op, want = ops[name], reference()
        assert op.prepare(*args, **kwargs).empty, name
        for backend in (None, *op.backend_names):
            got = op(*args, backend=backend, **kwargs)
            for g, w in zip(got if isinstance(got, tuple) else (got,),
                            want if isinstance(want, tuple) else (want,)):
                assert (g.shape, g.dtype, g.requires_grad) == (w.shape, w.dtype, w.requires_grad)
                assert torch.equal(g, w), (name, backend)
            if "out" in kwargs:
                assert got is kwargs["out"], (name, backend)
            if args[0].requires_grad:
                values = got[0] if isinstance(got, tuple) else got
                (dx,) = torch.autograd.grad(values.sum(), args[0])
                assert dx.shape == args[0].shape, (name, backend)
            seen.add((name, backend))
    assert not launched, launched
    assert {name for name, _ in seen} == set(ops), "an op without an empty call here"


# -- source hashes ---------------------------------------------------------------------------------
def _triton_backends():
    return [(op, b) for op in all_ops() for b in op.backends if b.uses_triton]


# Small calls that between them reach every launch path of every backend under the interpreter
# (single / split / cooperative modes, forward and backward).
def _calls(op_name: str):
    g = torch.Generator().manual_seed(0)
    if op_name == "isin":
        for m, n, dtype in ((40, 7, torch.int32), (300, 90, torch.int64), (64, 33, torch.float32),
                            (100, 2000, torch.int16)):
            a = torch.randint(-50, 50, (m,), generator=g).to(dtype)
            b = torch.randint(-50, 50, (n,), generator=g).to(dtype)
            yield (a, b), {}
    elif op_name == "permute":
        x = torch.randn(3, 4, 5, 6, generator=g)
        for dims in ((3, 2, 1, 0), (0, 2, 1, 3), (1, 0, 2, 3), (0, 1, 3, 2)):
            yield (x, dims), {}
        yield (torch.randn(40, 3, generator=g).to(torch.float16), (1, 0)), {}
    elif op_name in ("softmax", "log_softmax"):
        for shape, dim in (((4, 50), -1), ((3, 3000), -1), ((5, 6, 7), 1), ((2, 20000), -1)):
            yield (torch.randn(*shape, generator=g, requires_grad=True), dim), {}
    elif op_name == "topk":
        for shape, k in (((4, 300), 5), ((2, 9000), 20), ((1, 20000), 3), ((3, 64), 1)):
            for dtype in (torch.float32, torch.int64):
                yield (torch.randn(*shape, generator=g).mul(100).to(dtype), k), {}
    elif op_name == "matmul":
        for a, b in (((3, 300), (300, 40)), ((2, 70, 40), (40, 130))):
            yield (torch.randn(*a, generator=g), torch.randn(*b, generator=g)), {}
    elif op_name == "linear":
        yield (torch.randn(5, 300, generator=g).half(), torch.randn(33, 300, generator=g).half(),
               torch.randn(33, generator=g).half()), {}


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("op_name", ["isin", "permute", "softmax", "log_softmax", "topk",
                                     "matmul", "linear"])
def test_every_launched_kernel_is_in_its_backends_hash(cpu_triton, op_name):
    _kernel_backend_classes()  # (imports every kernels package: each registers its ops)
    op = next(o for o in all_ops() if o.name == op_name)
    launched: list = []
    previous = Launcher.observer
    Launcher.observer = launched.append
    try:
        for backend in op.backends:
            if not backend.uses_triton:
                continue
            covered = set(closure(backend_roots(backend)))
            ran = 0
            for args, kwargs in _calls(op_name):
                call = op.prepare(*args, **kwargs)
                if call.empty or backend.supports(call) is not None:
                    continue
                launched.clear()
                out = op(*args, backend=backend.name, **kwargs)
                if isinstance(out, torch.Tensor) and out.requires_grad:
                    out.backward(torch.ones_like(out))  # the backward kernels count too
                ran += 1
                missing = {qualified_name(k) for k in launched} - covered
                assert not missing, (f"{op_name}/{backend.name} launched {sorted(missing)}, "
                                     "which its source hash does not cover")
            assert ran, f"no test call reaches {op_name}/{backend.name}"
    finally:
        Launcher.observer = previous


def test_the_observer_sees_launches(cpu_triton):
    # The coverage test above is only as good as the observer: a forced Triton run is seen.
    launched: list = []
    previous, Launcher.observer = Launcher.observer, launched.append
    try:
        opselect.ops.softmax(torch.randn(4, 8), -1, backend="fused")
    finally:
        Launcher.observer = previous
    assert launched


def test_hash_covers_called_helpers_and_constexpr_globals(cpu_triton):
    for op, backend in _triton_backends():
        covered = closure(backend_roots(backend))
        roots = {qualified_name(k) for k in backend_roots(backend)}
        assert roots <= set(covered), (op.name, backend.name)
    # topk's radix kernels read constexpr globals (the workspace's counters, the spin limit).
    radix = next(b for op, b in _triton_backends() if op.name == "topk" and b.name == "radix")
    names = {n.rsplit(".", 1)[-1] for n in closure(backend_roots(radix))}
    assert {"COUNTERS", "SPIN_LIMIT"} <= names


_HASHES_SCRIPT = """
import json
import opselect
from opselect.dispatch.backend import Backend
from opselect.dispatch.op import all_ops
print(json.dumps({f"{op.name}/{b.name}": b.source_hash for op in all_ops() for b in op.backends}))
"""


def _hashes_of(package_root: Path, env_extra: dict | None = None) -> dict[str, str]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(package_root))
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", _HASHES_SCRIPT], env=env, cwd=package_root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _copy_package(tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(PACKAGE, root / "opselect",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def _edit_function(root: Path, function: str) -> str:
    """Add a statement to the body of the module-level function `function` in the copy; returns
    the module it lives in."""
    for path in (root / "opselect").rglob("*.py"):
        text = path.read_text()
        match = re.search(rf"^def {re.escape(function)}\(.*?\):\n", text, re.M | re.S)
        if match:
            edited = text[:match.end()] + "    _edited = 0  # an edit for the test\n" + \
                text[match.end():]
            path.write_text(edited)
            return str(path.relative_to(root))
    raise AssertionError(f"no function {function} in the copy")


@pytest.mark.slow
def test_editing_a_shared_helper_rehashes_exactly_its_users(tmp_path):
    # topk's _key_limits is called by the radix, tournament, maxima and argmax kernels, not by
    # bitonic's (and torch / sort run no kernels): an edit must re-measure those four and
    # nothing else.
    root = _copy_package(tmp_path)
    before = _hashes_of(root)
    where = _edit_function(root, "_key_limits")
    after = _hashes_of(root)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"topk/radix", "topk/tournament", "topk/maxima", "topk/argmax"}, (
        where, changed)


@pytest.mark.slow
def test_hashes_are_the_same_in_every_process_and_follow_switches(tmp_path):
    root = _copy_package(tmp_path)
    first, second = _hashes_of(root), _hashes_of(root)
    assert first == second
    # OPSELECT_TOPK_PDL changes what maxima launches: its timings must not be trusted across it.
    off = _hashes_of(root, {"OPSELECT_TOPK_PDL": "0"})
    assert off["topk/maxima"] != first["topk/maxima"]
    assert off["isin/hash"] == first["isin/hash"]
