"""The helper process of dispatch/isolation.py: runs each candidate's first run on a call the
parent sends, and replies whether it finished.

It is started as `python -I -c <isolation._BOOT> PATH MODULES`: PATH is its import path, MODULES
the modules besides opselect that register ops (both decided by the parent). It imports those once,
says which ops it has, then serves requests; a request names an op and a backend, never a module.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch


def serve(modules: list[str]) -> int:
    from .isolation import _decode, _read_message, _write_message
    from .op import all_ops, get_op

    stdin = sys.stdin.buffer
    # Anything the kernels, the compiler or a driver prints must not corrupt the replies (or fill
    # the pipe while the parent waits to write): replies go to a private copy of fd 1, and fd 1
    # itself, for Python and C alike, now goes where stderr goes.
    sys.stdout.flush()
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import opselect  # noqa: F401  - registers opselect's own ops

    failed = {}
    for module in modules if isinstance(modules, list) else []:
        try:
            importlib.import_module(str(module))
        except Exception as exc:  # noqa: BLE001 - its ops run in the parent, which is told why
            failed[str(module)] = f"{type(exc).__name__}: {str(exc)[:200]}"
    _write_message(stdout, {"ready": True, "ops": sorted(op.name for op in all_ops()),
                            "failed": failed}, [])
    inputs: dict = {}  # the last call's arguments: later configs of the call arrive without them
    while True:
        try:
            request, blobs = _read_message(stdin)
        except EOFError:
            return 0
        if request.get("same_inputs"):
            request.update(args=inputs.get("args", []), kwargs=inputs.get("kwargs", {}))
            blobs = inputs.get("blobs", [])
        else:
            inputs = {"args": request["args"], "kwargs": request["kwargs"], "blobs": blobs}
        try:
            op = get_op(request["op"])
            args = _decode(request["args"], blobs)
            kwargs = {k: _decode(v, blobs) for k, v in request["kwargs"].items()}
            config = {k: _decode(v, blobs) for k, v in request["config"].items()}
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            device = next((t.device for t in tensors if t.device.type == "cuda"), None)
            call = op.prepare(*args, **kwargs)
            backend = op.backend(request["backend"])
            fn = lambda: backend.run(call, config)  # noqa: E731
            (op.timed(call, fn) if op.timed is not None else fn)()
            if device is not None:
                torch.cuda.synchronize(device)
            reply: dict = {"ok": True}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which ranks it last
            reply = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        _write_message(stdout, reply, [])
