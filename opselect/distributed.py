"""Choices that agree across the ranks of a torch.distributed job.

Each process decides alone (its memo, its cache, its measurements), so two ranks may run
different kernels for the same call: different speed, and for reductions bitwise different
results. Two collectives make them agree:

    opselect.distributed.sync(group=None)               # every rank adopts the same choices
    opselect.distributed.assert_consistent(group=None)  # raises, naming any key ranks differ on

The rule for collectives: they happen only inside these two functions, which the program calls
at a point every rank of the group reaches (after a warm-up step, say), never on a call's own
path. So a key that one rank sees and another does not can never hang the job: between syncs it
is decided by the rank that sees it, and sync() then gives every rank the same answer.

How sync() agrees (every rank measures, the timings are reduced, not rank 0 alone): each rank
sends, for every key it has decided, its choice and the timings its tune cache holds for that key
(measured on that rank's GPU); for a key some rank has timings of, every backend's time is the
largest over the ranks that measured it (a collective step waits for the slowest rank, so that is
the time the job pays) and the choice is the fastest by that time (torch kept within the
dispatcher's margin, ties broken by name); a key no rank measured takes the choice of the lowest
rank that decided it (cold choices come from the cost model, the same on every rank once the
calibration is). The cost model's calibration is rank 0's, installed on every rank. Everything
exchanged is JSON text in byte tensors (no pickle).
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from .dispatch import all_ops, op as _op_module
from .dispatch.decision import Candidate
from .errors import InconsistentChoices, OpselectError


def _dist():
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("opselect.distributed: torch.distributed is not initialised "
                           "(call torch.distributed.init_process_group first)")
    return dist


def _comm_device(dist: Any, group: Any) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_text(text: str, group: Any = None) -> list[str]:
    """Every rank's text, in rank order, through byte tensors (no pickle)."""
    dist = _dist()
    device = _comm_device(dist, group)
    data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8) \
        if text else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(max(longest, 1), dtype=torch.uint8, device=device)
    padded[:data.numel()] = data.to(device)
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return [bytes(p[:int(s.item())].cpu().tolist()).decode("utf-8")
            for p, s in zip(parts, sizes)]


def _key_tail(key: tuple) -> str:
    return repr(key[1:])


def _local_key(form: str, kind: str, tail: tuple) -> tuple:
    """The memo key on this rank for a key tail: the device part is this rank's device of that
    kind, spelled as the op spells it (a torch.device, or a CUDA index / the device type)."""
    if kind == "cuda":
        here = torch.device("cuda", torch.cuda.current_device())
    else:
        here = torch.device(kind)
    if form == "device":
        return (here, *tail)
    return (here.index if here.type == "cuda" else here.type, *tail)


def _device_of_key(part: Any) -> tuple[str, str]:
    """(form, kind) of a memo key's device part."""
    if isinstance(part, torch.device):
        return "device", part.type
    return "index", "cuda" if isinstance(part, int) else str(part)


def decisions() -> dict[str, dict[str, str]]:
    """This process's auto decisions: {op: {key tail: backend}}."""
    return {op.name: {_key_tail(k): c.backend.name for k, c in op._memo.items()}
            for op in all_ops() if op._memo}


def _report(info_of: dict) -> str:
    """This rank's decisions with the timings its cache holds, as JSON."""
    from .tune_cache import store

    out = []
    for op in all_ops():
        for key, choice in list(op._memo.items()):
            call_info = info_of.get((op.name, key))
            timings: dict[str, float] = {}
            if call_info is not None:
                hashes = {b.name: b.source_hash for b in op.backends}
                measured = store().get_timings(op.name, call_info, key[1:], hashes)
                timings = {n: (t if math.isfinite(t) else 1e30)
                           for n, (t, *_config_host_device) in measured.items()}
            form, kind = _device_of_key(key[0])
            out.append({"op": op.name, "key": _key_tail(key), "choice": choice.backend.name,
                        "config": choice.config, "timings": timings, "form": form,
                        "kind": kind})
    return json.dumps(out, sort_keys=True)


def _infos() -> dict:
    """(op, key) -> the DeviceInfo its calls ran on (the cache's timings are filed under it)."""
    from .dispatch.device import device_info

    out = {}
    for op in all_ops():
        for key in op._memo:
            form, kind = _device_of_key(key[0])
            try:
                info = device_info(key[0] if form == "device" else
                                   torch.device("cuda", key[0]) if kind == "cuda"
                                   else torch.device(kind))
            except (RuntimeError, TypeError, ValueError):
                continue
            out[(op.name, key)] = info
    return out


def _merge(entries: list[tuple[int, dict]]) -> tuple[str, dict]:
    """The agreed (choice, config) of one key from (rank, entry) pairs."""
    timings: dict[str, float] = {}
    configs: dict[str, dict] = {}
    for _rank, e in entries:
        for name, t in e["timings"].items():
            timings[name] = max(timings.get(name, 0.0), float(t))
        configs.setdefault(e["choice"], e["config"])
    if timings:
        names = sorted(timings, key=lambda n: (n != "torch", n))  # torch first: the margin
        able = [Candidate(n, None, measured_s=timings[n]) for n in names]
        best = _op_module.choose(able, lambda c: c.measured_s, _op_module.MEASURED_TORCH_MARGIN)
        chosen = best.name
    else:
        chosen = min(entries, key=lambda re: re[0])[1]["choice"]
    config = next((e["config"] for _r, e in sorted(entries, key=lambda re: re[0])
                   if e["choice"] == chosen), {})
    return chosen, config


def sync(group: Any = None) -> int:
    """Every rank adopts the same choice for every key any rank decided (a collective: call it
    where every rank of the group arrives). Returns the number of keys agreed."""
    from .heuristics import device_model

    dist = _dist()
    # The cost model's calibration: rank 0's, everywhere (cold choices then agree).
    models = {k: {f: getattr(m, f) for f in device_model.CONSTANT_NAMES}
              | {"scales": dict(m.scales)} for k, m in device_model._models.items()}
    calibrations = _all_gather_text(json.dumps(models, sort_keys=True), group)
    ranks = [json.loads(text) for text in _all_gather_text(_report(_infos()), group)]
    mine = dist.get_rank(group)
    for cache_key, consts in json.loads(calibrations[0]).items():
        here = device_model._models.get(cache_key)
        if here is not None and mine != 0:
            scales = consts.pop("scales", {})
            device_model._models[cache_key] = device_model.with_calibration(here, consts, scales)
    if mine != 0:
        # Cold choices are the model's: made again with rank 0's constants, they agree (a
        # cold choice depends on the exact call and the model only, Op._cold).
        for op in all_ops():
            op._cold.clear()
    by_key: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for rank, entries in enumerate(ranks):
        for e in entries:
            by_key.setdefault((e["op"], e["key"]), []).append((rank, e))
    ops = {op.name: op for op in all_ops()}
    agreed = 0
    for (op_name, tail_text), entries in sorted(by_key.items()):
        op = ops.get(op_name)
        if op is None:
            continue
        choice, config = _merge(entries)
        try:
            backend = op.backend(choice)
        except OpselectError:
            continue
        tail = _parse_tail(tail_text)
        if tail is None:
            continue
        first = entries[0][1]
        key = _local_key(first["form"], first["kind"], tail)
        op._memo[key] = _op_module.Choice(backend, dict(config), "distributed")
        agreed += 1
    return agreed


def _parse_tail(text: str) -> tuple | None:
    """A key tail back from its repr (it holds ints, strs, bools, None, torch dtypes and tuples
    of them); parsed with ast.literal_eval after naming the dtypes, never eval."""
    import ast

    names = {}
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            names[f"torch.{name}"] = f"'__dtype__{name}'"
    for spelled, placeholder in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(spelled, placeholder)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None

    def back(v: Any) -> Any:
        if isinstance(v, str) and v.startswith("__dtype__"):
            return getattr(torch, v[len("__dtype__"):])
        if isinstance(v, tuple):
            return tuple(back(x) for x in v)
        return v

    return back(value) if isinstance(value, tuple) else None


def assert_consistent(group: Any = None) -> None:
    """Raise InconsistentChoices naming every key that two ranks decided differently (a
    collective: call it where every rank of the group arrives). A key only some ranks have
    decided is not a difference."""
    ranks = [json.loads(t) for t in
             _all_gather_text(json.dumps(decisions(), sort_keys=True), group)]
    differ = []
    keys = sorted({(op, key) for r in ranks for op, keys in r.items() for key in keys})
    for op, key in keys:
        seen = {i: r[op][key] for i, r in enumerate(ranks) if key in r.get(op, {})}
        if len(set(seen.values())) > 1:
            differ.append(f"{op} {key}: " + ", ".join(f"rank {i} {b}" for i, b in seen.items()))
    if differ:
        raise InconsistentChoices(f"ranks chose differently for {len(differ)} key(s): "
                                  + "; ".join(differ[:10]))
