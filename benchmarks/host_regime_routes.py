"""Host time of auto calls whose eager choice is torch and whose CUDA-graph choice differs (a
regime route, Op.routes' fourth slot): the route as it is (torch's op straight from the public
function, the graph's choice in the regime slot) against the route as it was before 2026-11-29
(a closure asking for the regime on every call, the torch side through the torch backend's
bind of the call, rebuilt here), and torch's own op; 3000 calls without a sync, 7 rounds in
turns, median us per call. "torch + the swap" is torch's op plus the two dict stores that put
the old route in place for its turn (subtract them from the old route's time).

    python benchmarks/host_regime_routes.py     (GPU; writes $OUT/regime_gpu.json)
"""
import json, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import torch
from opselect import ops
from opselect.dispatch import get_op, tuning_mode as TM

dev = "cuda"
x1 = torch.randn(21, 1, device=dev, dtype=torch.bfloat16)
x2 = torch.randn(8, 512, device=dev)
x3 = torch.randn(25, 3, 944, device=dev)
x4 = torch.randn(28, 54, device=dev)
x5 = torch.randn(6, 41, 60, device=dev)
a6 = torch.randint(0, 50, (256,), device=dev); b6 = torch.randint(0, 50, (16,), device=dev)
cases = [("softmax 21x1 dim0 bf16", "softmax", lambda: ops.softmax(x1, 0), lambda: torch.softmax(x1, 0), (x1, 0)),
         ("softmax 8x512 fp32", "softmax", lambda: ops.softmax(x2, -1), lambda: torch.softmax(x2, -1), (x2, -1)),
         ("softmax 25x3x944 dim1", "softmax", lambda: ops.softmax(x3, 1), lambda: torch.softmax(x3, 1), (x3, 1)),
         ("topk 28x54 k=30", "topk", lambda: ops.topk(x4, 30), lambda: torch.topk(x4, 30), (x4, 30)),
         ("permute 6x41x60 120", "permute", lambda: ops.permute(x5, (1, 2, 0)), lambda: torch.permute(x5, (1, 2, 0)).contiguous(), (x5, (1, 2, 0))),
         ("isin 256 in 16", "isin", lambda: ops.isin(a6, b6), lambda: torch.isin(a6, b6), (a6, b6))]

def per(fn, n=3000):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    r = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return r

out = {}
for name, opname, auto, ref, args in cases:
    op = get_op(opname)
    before = dict(op.routes)
    auto(); auto()
    new = [(k, v) for k, v in op.routes.items() if k not in before]
    fns = {"torch": ref, "auto (route now)": auto}
    kind = "no route"
    if new:
        k, v = new[-1]
        kind = f"{v[2]} regime={'yes' if v[3] is not None else 'no'}"
        if v[3] is not None and v[0] is None:
            graph, info = v[3]
            eager = op._torch.bind(op.prepare(*args), {})
            def by_regime(*tensors, graph=graph, info=info, eager=eager):
                return (graph if TM.capturing(info) else eager)(*tensors)
            old = (by_regime, v[1], v[2], None)
            def auto_before(k=k, v=v, old=old):
                op.routes[k] = old
                try:
                    return auto()
                finally:
                    op.routes[k] = v
            def swap(k=k, v=v, old=old):
                op.routes[k] = old; op.routes[k] = v
                return ref()
            fns["auto (route before)"] = auto_before
            fns["torch + the swap"] = swap
    res = {f: [] for f in fns}
    for _ in range(7):
        for f, fn in fns.items(): res[f].append(per(fn))
    out[name] = {"route": kind, **{f: statistics.median(v) for f, v in res.items()}}
    print(name, "|", kind, "|", " ".join(f"{f}={statistics.median(v):.2f}" for f, v in res.items()), flush=True)
if os.environ.get("OUT"):
    open(os.path.join(os.environ["OUT"], "regime_gpu.json"), "w").write(json.dumps(out, indent=1))
