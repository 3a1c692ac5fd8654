"""First runs in a separate process: tuning survives a candidate that crashes.

Tuning runs every backend of a call, so a backend that faults on this machine for this call (a
bad address under some plan, a compiler or driver bug) would take the user's process down with
it: a segfault is not an exception. So a candidate that has never run here for the call's key (the
tune cache has no timing of it) first runs once in a helper process. If that process dies, the
candidate is ranked last, with one warning naming it and how it died, and the user's process goes
on; candidates that ran there are then measured in-process as before.

The helper is one child process per user process, started on first need (a few seconds: it
imports torch and opselect), reused for every later first run and started again after a crash. It
is not a multiprocessing child: those re-import the user's __main__ module, which would run the
user's program again. Requests go over the child's stdin as a JSON header and raw tensor bytes
(inputs are copied: the child never sees the user's memory, and a kernel that scribbles cannot
touch it); nothing is pickled.

The helper runs code only from where this process already does. Tuning may run as root from any
working directory, so the helper is started isolated (`python -I`: no working directory or script
directory on its path, no PYTHON* variables, no user site-packages) with an explicit import path:
the directory this opselect was imported from, then this process's own sys.path minus relative
entries and the working directory. It runs in a private temporary directory, with an environment
reduced to what torch, Triton and opselect read (_KEPT_ENV). It imports opselect and the modules
that registered this process's other ops or defined their backends (a plug-in's, docs/
EXTENDING.md), a table fixed when it starts (on its command line; started again when a plug-in
adds one); a request names an op of that table, never a module. An op or backend the helper does
not have (defined in __main__, say) has its first runs in this process, as before isolation.

OPSELECT_TUNE_ISOLATE=0 turns this off (a candidate then runs in the user's process straight
away); OPSELECT_TUNE_ISOLATE_TIMEOUT (seconds, default 300) bounds one first run, compile
included. An op takes part when it says how to replay a call (Op.replay).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

ENABLED = os.environ.get("OPSELECT_TUNE_ISOLATE", "1") != "0"
TIMEOUT_S = float(os.environ.get("OPSELECT_TUNE_ISOLATE_TIMEOUT", "300"))
_HEADER = struct.Struct("<Q")  # the length of the JSON header that follows
#: a request's header is small (arguments, shapes); one far larger is not ours
MAX_HEADER = 1 << 20
#: what the helper's environment keeps: names, and prefixes of names, that torch, Triton, the CUDA
#: driver and opselect read (OPSELECT_* switches change what a backend runs, so they must match)
_KEPT_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TMPDIR", "TEMP",
                       "TMP", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "CC", "CXX", "OMP_NUM_THREADS",
                       "MKL_NUM_THREADS", "SYSTEMROOT"})
_KEPT_ENV_PREFIXES = ("OPSELECT_", "TRITON_", "CUDA_", "NVIDIA_", "CUBLAS_", "CUDNN_", "TORCH_",
                      "PYTORCH_", "TORCHINDUCTOR_", "HIP_", "ROCR_", "HSA_", "LC_")
#: the helper's first lines: its import path and its modules come on its command line
_BOOT = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
         "from opselect.dispatch.isolation_child import serve; "
         "sys.exit(serve(json.loads(sys.argv[2])))")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class _Encoder:
    """Turns a call's arguments into JSON plus a list of byte blobs (tensors), and back."""

    def __init__(self) -> None:
        self.blobs: list[bytes] = []

    def encode(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).replace("torch.", "")}
        if isinstance(value, (list, tuple)):
            return {"seq": [self.encode(v) for v in value], "tuple": isinstance(value, tuple)}
        if value is None or isinstance(value, (bool, int, float, str)):
            if isinstance(value, float) and not math.isfinite(value):
                return {"float": repr(value)}
            return value
        raise TypeError(f"cannot send a {type(value).__name__} to the first-run process")

    def _tensor(self, t: torch.Tensor) -> dict:
        grad = t.requires_grad  # (a call under autograd runs its backward too)
        t = t.detach()
        size, stride = list(t.shape), list(t.stride())
        # Only the span of storage the view reaches (a slice of a large tensor sends the slice).
        span = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if t.numel() else 0
        flat = torch.as_strided(t, (span,), (1,), t.storage_offset()) if span else t.reshape(0)
        raw = flat.cpu().contiguous().view(torch.uint8).numpy().tobytes()
        self.blobs.append(raw)
        return {"tensor": len(self.blobs) - 1, "dtype": str(t.dtype).replace("torch.", ""),
                "size": size, "stride": stride, "device": str(t.device), "grad": grad}


def _decode(value: Any, blobs: list[bytes]) -> Any:
    if isinstance(value, dict):
        if "tensor" in value:
            dtype = _dtype(value["dtype"])
            raw = blobs[value["tensor"]]
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
                torch.empty(0, dtype=torch.uint8)
            flat = flat.view(dtype)
            flat = flat.to(torch.device(value["device"]))  # the same machine: the same devices
            t = torch.as_strided(flat, value["size"], value["stride"], 0)
            return t.requires_grad_() if value.get("grad") else t
        if "dtype" in value:
            return _dtype(value["dtype"])
        if "float" in value:
            return float(value["float"])
        if "seq" in value:
            items = [_decode(v, blobs) for v in value["seq"]]
            return tuple(items) if value["tuple"] else items
    return value


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a dtype: {name!r}")
    return dtype


def _write_message(stream, header: dict, blobs: list[bytes]) -> None:
    data = json.dumps({**header, "blobs": [len(b) for b in blobs]}).encode()
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    for blob in blobs:
        stream.write(blob)
    stream.flush()


def _read_exact(stream, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = stream.read(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def _read_message(stream) -> tuple[dict, list[bytes]]:
    (n,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    if n > MAX_HEADER:
        raise ValueError(f"a message header of {n} bytes")
    header = json.loads(_read_exact(stream, n))
    blobs = [_read_exact(stream, size) for size in header.pop("blobs")]
    return header, blobs


# -- the parent's side ------------------------------------------------------------------------------
def helper_path() -> list[str]:
    """The helper's import path: the directory holding this opselect package first, then this
    process's sys.path without '' and relative entries (they name the working directory) and
    without the working directory itself."""
    here = str(Path(__file__).resolve().parents[2])
    cwd = os.path.realpath(os.getcwd())
    out = [here]
    for entry in sys.path:
        if not isinstance(entry, str) or not os.path.isabs(entry) or entry in out:
            continue
        if os.path.realpath(entry) == cwd or not os.path.exists(entry):
            continue
        out.append(entry)
    return out


def helper_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k in _KEPT_ENV or k.startswith(_KEPT_ENV_PREFIXES)}
    env.update(OPSELECT_TUNE="0", OPSELECT_TUNE_ISOLATE="0")
    return env


def op_modules(ops: Iterable[Any]) -> list[str]:
    """The modules, besides opselect's, that registered these ops or defined their backends (a
    plug-in's backend added to one of opselect's ops: importing its module adds it there too);
    the helper imports them when it starts. Ops and backends defined in __main__ cannot be
    imported again and are left out."""
    names = set()
    for op in ops:
        for module in (getattr(op.prepare, "__module__", None),
                       *(type(b).__module__ for b in getattr(op, "backends", ()))):
            if _importable(module or ""):
                names.add(module)
    return sorted(names)


def _importable(module: str) -> bool:
    """A module outside opselect that the helper can import by name."""
    return not (module == "opselect" or module.startswith("opselect.") or module == "__main__"
                or module == "builtins") and bool(_MODULE_NAME.fullmatch(module))


def _helper_has(op: Any, backend: str) -> bool:
    """Whether the helper gets this backend of op when it imports the op's modules: not one
    defined in __main__ (its first runs happen in this process, as before isolation)."""
    return type(op.backend(backend)).__module__ != "__main__"


class _Child:
    """The helper process, started on first need and again after it dies."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.inputs: int | None = None  # which call's arguments the running process holds
        self.ops: frozenset[str] = frozenset()  # the ops the running helper can replay
        self.modules: list[str] = []  # the modules it was started with
        self.workdir: str | None = None

    def _start(self, modules: list[str]) -> subprocess.Popen:
        self.workdir = tempfile.mkdtemp(prefix="opselect-helper-")  # 0700, ours
        return subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, json.dumps(helper_path()), json.dumps(modules)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd=self.workdir, env=helper_environment())

    def _ensure(self, op_name: str, ops: Iterable[Any]) -> str | None:
        """A running helper that has op_name (started, or restarted with the modules of `ops`,
        this process's registered ops, as needed); None, or why there is none."""
        modules = op_modules(ops)
        # A helper started before a plug-in added a backend (to one of opselect's ops, which it
        # has) lacks that backend: it is started again with the plug-in's module.
        if self.proc is not None and self.proc.poll() is None and op_name in self.ops \
                and set(modules) <= set(self.modules):
            return None
        if self.proc is not None and self.proc.poll() is None and modules == self.modules:
            return f"its helper process does not have the op {op_name!r}"
        self._stop()
        try:
            self.proc = self._start(modules)
        except OSError as exc:  # no permission to run Python here, no processes left
            self._stop()
            return str(exc)
        self.modules = modules
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT_S)
        try:
            if not ready:
                raise EOFError
            header, _ = _read_message(self.proc.stdout)
        except (EOFError, OSError, ValueError):
            code = self.proc.poll()
            self._stop()
            return f"it did not start ({_how(code) if code is not None else 'no answer'})"
        self.ops = frozenset(header.get("ops") or ())
        if op_name not in self.ops:
            failed = header.get("failed") or {}
            return f"its helper process does not have the op {op_name!r}" + (
                f" ({'; '.join(f'{m}: {e}' for m, e in failed.items())})" if failed else "")
        return None

    def run(self, request: dict, blobs: list[bytes], inputs: int,
            ops: Iterable[Any] = ()) -> tuple[str, str]:
        """('ok', '') | ('error', message) | ('crashed', how) | ('timeout', '') |
        ('unavailable', why): the helper process cannot be started here, or cannot replay this
        op. `inputs` names the call's arguments (request["args"], request["kwargs"] and the
        blobs): a process that already holds them is sent only the backend and config (a call
        tunes a dozen configs, and a 256 MB input through a pipe costs most of a second each
        time)."""
        with self.lock:
            why = self._ensure(request["op"], ops)
            if why is not None:
                return "unavailable", why
            proc = self.proc
            if self.inputs == inputs:
                request = {k: v for k, v in request.items() if k not in ("args", "kwargs")}
                request["same_inputs"] = True
                blobs = []
            # A helper that stops reading (stuck in a driver call) must not block this process
            # forever on a full pipe: the watchdog ends it, and the write then fails.
            # A daemon, started inside the try: a Ctrl-C between its start and the try once
            # left a live timer that held the interpreter's exit for TIMEOUT_S.
            stuck = threading.Event()
            watchdog = threading.Timer(TIMEOUT_S, lambda: (stuck.set(), proc.kill()))
            watchdog.daemon = True
            try:
                try:
                    watchdog.start()
                    _write_message(proc.stdin, request, blobs)
                finally:
                    watchdog.cancel()
                self.inputs = inputs
                ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
                if not ready:
                    self._stop()
                    return "timeout", f"no answer within {TIMEOUT_S:g} s"
                header, _ = _read_message(proc.stdout)
            except (EOFError, OSError, ValueError) as exc:  # it died, or its reply is not ours
                if proc.poll() is None:
                    proc.kill()
                code = proc.wait()
                self._stop()
                if stuck.is_set():
                    return "timeout", f"it took no request within {TIMEOUT_S:g} s"
                if isinstance(exc, ValueError):
                    return "crashed", "its reply was malformed"
                return "crashed", _how(code)
            return ("ok", "") if header.get("ok") else ("error", str(header.get("error")))

    def _stop(self, wait_s: float = 0.0) -> None:
        """End the helper (given wait_s to leave on its own after its stdin closes), close its
        pipes and remove its working directory."""
        proc, self.proc = self.proc, None
        self.inputs, self.ops = None, frozenset()
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass  # a broken pipe: it is gone already
            try:
                proc.wait(timeout=wait_s) if wait_s else None
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def close(self) -> None:
        with self.lock:
            self._stop(wait_s=5.0)


def _how(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_child = _Child()
_calls_sent = 0  # numbers each call's arguments, for _Child.run
_in_process: set[str] = set()  # ops the helper cannot replay (warned once each)
atexit.register(lambda: _child.close())


def first_runs(op: Any, runs: list[tuple[str, dict]], call: Any,
               ops: Iterable[Any] = ()) -> dict[int, str]:
    """Run each (backend name, config) once on the call in the helper process; returns {index
    in runs: reason} for those that crashed or raised there (the others ran fine). Returns {}
    when isolation is off or the op cannot replay its calls (they then run in-process). `ops`:
    every registered op (the helper imports the modules that define them; op among them)."""
    global ENABLED, _calls_sent
    if not ENABLED or getattr(op, "replay", None) is None or not runs:
        return {}
    try:
        args, kwargs = op.replay(call)
        enc = _Encoder()
        payload = {"args": enc.encode(list(args)),
                   "kwargs": {k: enc.encode(v) for k, v in kwargs.items()}}
        configs = [{k: enc.encode(v) for k, v in config.items()} for _, config in runs]
    except TypeError:
        return {}  # an argument that does not travel: run in-process as before
    failed = {}
    _calls_sent += 1
    for i, ((name, _), config) in enumerate(zip(runs, configs)):
        if not _helper_has(op, name):
            continue
        request = {"op": op.name, "backend": name, "config": config, **payload}
        status, detail = _child.run(request, enc.blobs, _calls_sent, [op, *ops])
        if status == "unavailable":
            if "does not have the op" in detail:
                if op.name not in _in_process:
                    _in_process.add(op.name)
                    warnings.warn(f"opselect: tuning runs the first runs of {op.name} in this "
                                  f"process: {detail}", RuntimeWarning, stacklevel=4)
                return {}
            ENABLED = False
            warnings.warn(f"opselect: tuning cannot start its first-run process ({detail}); "
                          "candidates run in this process from now on", RuntimeWarning,
                          stacklevel=4)
            return {}
        if status != "ok":
            failed[i] = f"{status}: {detail}" if detail else status
    return failed


def shutdown() -> None:
    """Stop the helper process (at exit; tests)."""
    _child.close()


def warn_failed(what: str, reason: str) -> None:
    warnings.warn(f"opselect: measuring {what} failed: its first run, in a separate process, "
                  f"{reason}; it will not be chosen", RuntimeWarning, stacklevel=5)


Replay = Callable[[Any], tuple[tuple, dict]]
