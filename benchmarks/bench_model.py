"""Does opselect make a model faster? Hugging Face models with and without opselect.enable(),
timed interleaved (needs the `hf` extra: pip install -e '.[hf]').

Models are built from a config with random weights on the device (nothing downloaded), with
eager attention, so their softmax is a torch call opselect can route (and the head merge a copy
of a transposed view, a permute):

  gpt2        GPT-2 124M's shape (12 layers, hidden 768, 12 heads, vocab 50257), float16
  llama3-8b   Llama-3-8B's configuration (32 layers, hidden 4096, intermediate 14336, 32 heads /
              8 KV heads, vocab 128256), bfloat16

Phases: `forward` of --tokens tokens (128), `forward-long` of 2,048 tokens (batches 1 and 8), and
one decode step with sampling as generate(do_sample=True) does it (transformers' own
TopKLogitsWarper, k = 50 / TopPLogitsWarper, p = 0.9, then softmax and multinomial):
`decode-topk`, `decode-topp`; and `train`, a training step's forward with labels (Hugging Face's
loss: the logits upcast to float32, F.cross_entropy) and backward, of 2,048 tokens (batches 1 and
8; GPT-2 only: an 8B model's gradients and activations at 8 x 2,048 tokens do not fit one GPU;
the model stays in eval mode, no dropout, no optimizer step). A decode step runs one token
against a static KV cache (transformers' StaticCache, as compiled generation uses) of --tokens
tokens, at a fixed cache position, so every call does the same work and CUDA graphs can capture
it.

Modes: `eager`; `compile` (torch.compile, inductor's default mode); `reduce-overhead`
(torch.compile(mode="reduce-overhead"): CUDA graphs).

Each cell (model, batch, phase, mode) times its two variants, without and with opselect, in
turns: --rounds rounds (at least 7) of A B / B A, each a block of calls between two syncs sized
to about --block-ms; reported per variant: the median ms per call and the range over the rounds,
and the ratio without / with (> 1: opselect is faster). The hosts are shared and noisy: a ratio
within the two variants' spread is no difference. Then one profiled call of each variant: the
device time per kernel / op, and the entries that gave or lost the most time.

Results: benchmarks/results/<gpu>/model.{json,md,png} (and $OUT), written after every cell.

    python benchmarks/bench_model.py                                  # everything (long)
    python benchmarks/bench_model.py --models gpt2 --modes eager,compile
    python benchmarks/bench_model.py --smoke                          # a tiny model on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, gpu_slug  # noqa: E402

import opselect  # noqa: E402

MODELS = ("gpt2", "llama3-8b")
PHASES = ("forward", "forward-long", "decode-topk", "decode-topp", "train")
MODES = ("eager", "compile", "reduce-overhead")
LONG_TOKENS = 2048
LONG_BATCHES = (1, 8)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny model on any device (CI)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--tokens", type=int, default=128, help="forward tokens / KV cache length")
    p.add_argument("--layers", type=int, default=None, help="override the model's layer count")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block-ms", type=float, default=60.0)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--deadline-s", type=float, default=float("inf"),
                   help="stop starting new cells after this many seconds (what ran is kept)")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--merge", action="store_true",
                   help="keep the saved cells this run does not measure")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Models and workloads
# ---------------------------------------------------------------------------------------------
def build(kind: str, layers: int | None, smoke: bool, device: torch.device, dtype: torch.dtype):
    import transformers

    if smoke:
        cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, hidden_size=32,
                                       intermediate_size=64, vocab_size=256,
                                       max_position_embeddings=LONG_TOKENS + 8) \
            if kind == "llama3-8b" else transformers.GPT2Config(
                n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=LONG_TOKENS + 8)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=layers or 12, n_head=12, n_embd=768,
                                      vocab_size=50257, n_positions=LONG_TOKENS + 8)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=layers or 32, num_attention_heads=32,
                                       num_key_value_heads=8, hidden_size=4096,
                                       intermediate_size=14336, vocab_size=128256,
                                       max_position_embeddings=8192, rope_theta=500000.0)
    cfg._attn_implementation = "eager"
    cfg.pad_token_id = 0
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # made in its dtype, on the device: 16 GB, not 32 on the host
    try:
        with torch.device(device):
            cls = (transformers.GPT2LMHeadModel if kind == "gpt2"
                   else transformers.LlamaForCausalLM)
            model = cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    return {"decode-topk": TopKLogitsWarper(top_k=50), "decode-topp": TopPLogitsWarper(top_p=0.9)}


def workload(model, phase: str, batch: int, tokens: int, device: torch.device):
    """A function of no arguments doing one call of the phase, the same work every time."""
    vocab = model.config.vocab_size
    gen = torch.Generator(device=device).manual_seed(0)
    length = LONG_TOKENS if phase in ("forward-long", "train") else tokens
    ids = torch.randint(3, vocab, (batch, length), device=device, generator=gen)
    if phase == "train":
        def train():
            model.zero_grad(set_to_none=True)
            loss = model(ids, labels=ids).loss
            loss.backward()
            return loss

        return train
    if phase.startswith("forward"):
        def forward():
            with torch.no_grad():
                return model(ids).logits

        return forward
    import inspect

    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=tokens + 1)
    # transformers 5 names the argument `cache` and counts the cache's length itself (a tensor
    # per layer); 4 took past_key_values and a cache_position.
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"
    with torch.no_grad():
        model(ids, use_cache=True, cache_position=torch.arange(tokens, device=device),
              **{name: cache})
    lengths = [layer.cumulative_length for layer in getattr(cache, "layers", ())
               if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
    last = ids[:, -1:].clone()
    position = torch.tensor([tokens], device=device)
    warp = warpers()[phase]

    def decode():
        with torch.no_grad():
            for length in lengths:  # back to the prompt: every step does the same work
                length.fill_(tokens)
            logits = model(last, use_cache=True, cache_position=position,
                           **{name: cache}).logits[:, -1, :]
            scores = warp(last, logits.float())
            probs = torch.nn.functional.softmax(scores, dim=-1)
            return torch.multinomial(probs, num_samples=1)

    return decode


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
def interleaved(variants: dict, rounds: int, block_s: float, sync) -> dict[str, list[float]]:
    """Seconds per call of each variant (fn, routed), taken in turns A B, B A, ... over
    `rounds` rounds; each turn a block of back-to-back calls between two syncs."""
    names = list(variants)
    calls = {}
    for name, (fn, routed) in variants.items():
        with opselect.enabled() if routed else nullcontext():
            for _ in range(2):  # compile, decide, capture
                fn()
            sync()
            start = time.perf_counter()
            fn()
            sync()
            once = time.perf_counter() - start
        calls[name] = max(1, min(200, int(block_s / max(once, 1e-6))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn, routed = variants[name]
            with opselect.enabled() if routed else nullcontext():
                sync()
                start = time.perf_counter()
                for _ in range(calls[name]):
                    fn()
                sync()
            samples[name].append((time.perf_counter() - start) / calls[name])
    return samples


def profile(fn, routed: bool, device: torch.device) -> dict[str, float]:
    """Device microseconds per kernel / op name over one call (the profiler's own names)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with opselect.enabled() if routed else nullcontext():
        fn()
        with torch_profile(activities=activities) as prof:
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if device.type == "cuda":
            # The kernels themselves (events on the device), not the ops that launched them:
            # an op's time counts its kernels again.
            if "CUDA" not in str(getattr(event, "device_type", "")).upper():
                continue
            us = getattr(event, "self_device_time_total", None)
            if us is None:
                us = getattr(event, "self_cuda_time_total", 0.0)
        else:
            us = event.self_cpu_time_total
        if us and not event.key.startswith("ProfilerStep"):
            out[event.key] = float(us)
    return out


def gave_and_lost(without: dict[str, float], with_: dict[str, float], top: int = 6) -> list:
    """The entries whose device time changed most with opselect: (name, us without, us with)."""
    names = set(without) | set(with_)
    moved = sorted(names, key=lambda n: -abs(with_.get(n, 0.0) - without.get(n, 0.0)))
    return [(n[:90], round(without.get(n, 0.0), 1), round(with_.get(n, 0.0), 1))
            for n in moved[:top]]


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def cells(args) -> list[tuple[str, int, str, str]]:
    out = []
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for phase in args.phases.split(","):
                if phase in ("forward-long", "train") and batch not in LONG_BATCHES:
                    continue
                if phase == "train" and model != "gpt2" and not args.smoke:
                    continue  # (the module docstring says why)
                for mode in args.modes.split(","):
                    out.append((model, batch, phase, mode))
    return out


def run_cell(model, phase: str, batch: int, mode: str, args, device, sync) -> dict:
    fn = workload(model, phase, batch, 8 if args.smoke else args.tokens, device)
    torch._dynamo.reset()
    if mode != "eager":
        backend = "aot_eager" if device.type != "cuda" else "inductor"
        fn = torch.compile(fn, backend=backend,
                           mode="reduce-overhead" if mode == "reduce-overhead" and
                           device.type == "cuda" else None)
    variants = {"without": (fn, False), "with": (fn, True)}
    row: dict = {"batch": batch, "phase": phase, "mode": mode}
    opselect.reset_stats()
    samples = interleaved(variants, max(2, args.rounds), args.block_ms / 1e3, sync)
    for name, s in samples.items():
        row[name] = {"median_ms": statistics.median(s) * 1e3, "min_ms": min(s) * 1e3,
                     "max_ms": max(s) * 1e3}
    row["ratio"] = row["without"]["median_ms"] / row["with"]["median_ms"]
    # Beyond the spread: the medians differ by more than either variant's own range.
    spread = max(row["without"]["max_ms"] - row["without"]["min_ms"],
                 row["with"]["max_ms"] - row["with"]["min_ms"])
    row["beyond_spread"] = abs(row["without"]["median_ms"] - row["with"]["median_ms"]) > spread
    row["opselect_calls"] = {op: s["backends"] or s["traced"]
                             for op, s in opselect.stats().items()}
    if not args.no_profile:
        try:
            without, with_ = profile(fn, False, device), profile(fn, True, device)
            row["moved"] = gave_and_lost(without, with_)
        except Exception as exc:  # noqa: BLE001 - a profile is a bonus, not the result
            row["moved_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    torch._dynamo.reset()
    return row


def run(args) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.monotonic()
    result = _header(args, device)
    out = RESULTS / result["gpu"]
    saved = out / "model.json"
    kept = []
    if args.merge and saved.exists():
        before = json.loads(saved.read_text())
        kept = [dict(r, measured=r.get("measured", before.get("date", "?")),
                     rounds=r.get("rounds", before.get("rounds")))
                for r in before.get("rows", [])]
    rows: list[dict] = []
    todo = cells(args)
    models: dict = {}
    for name, batch, phase, mode in todo:
        if time.monotonic() - started > args.deadline_s:
            print(f"deadline: {name} batch {batch} {phase} {mode} and later cells not run")
            break
        if name not in models:
            models.clear()  # one large model on the device at a time
            if device.type == "cuda":
                torch.cuda.empty_cache()
            dtype = torch.float32 if args.smoke or device.type == "cpu" else \
                (torch.float16 if name == "gpt2" else torch.bfloat16)
            torch.manual_seed(0)
            models[name] = build(name, args.layers, args.smoke, device, dtype)
        try:
            row = run_cell(models[name], phase, batch, mode, args, device, sync)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            row = {"batch": batch, "phase": phase, "mode": mode,
                   "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            print(f"  !! {name} batch {batch} {phase} {mode}: {row['error']}", flush=True)
        row["model"] = name
        row["measured"], row["rounds"] = time.strftime("%Y-%m-%d"), args.rounds
        rows.append(row)
        if "ratio" in row:
            print(f"{name:<10} b{batch:<3} {phase:<13} {mode:<16} without "
                  f"{row['without']['median_ms']:9.3f} ms  with {row['with']['median_ms']:9.3f} "
                  f"ms  ratio {row['ratio']:.3f}{'' if row['beyond_spread'] else ' (noise)'}",
                  flush=True)
        done = {(r["model"], r["batch"], r["phase"], r["mode"]) for r in rows}
        result["rows"] = [r for r in kept if (r.get("model"), r["batch"], r["phase"], r["mode"])
                          not in done] + rows
        result["seconds"] = time.monotonic() - started
        _save(result, args, out)
    return result


def _header(args, device) -> dict:
    import transformers
    import triton

    return {"benchmark": "model", "gpu": gpu_slug(device),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "opselect": opselect.__version__, "date": time.strftime("%Y-%m-%d"),
            "smoke": args.smoke, "tokens": args.tokens, "long_tokens": LONG_TOKENS,
            "rounds": args.rounds, "block_ms": args.block_ms, "rows": []}


def _save(result: dict, args, out: Path) -> None:
    text = json.dumps(result, indent=1)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "model.json").write_text(text)
    if args.smoke or args.no_save:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(text)
    (out / "model.md").write_text(markdown(result))
    plot(result, out / "model.png")


def _dates(result: dict) -> str:
    """When the rows were measured (a --merge run keeps older rows; a row without a date is
    from before rows carried one, the date of the run it came from)."""
    counts: dict[str, int] = {}
    for r in result["rows"]:
        day = r.get("measured", result.get("kept_date", result["date"]))
        counts[day] = counts.get(day, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return "rows measured " + ", ".join(f"{d} ({n})" for d, n in sorted(counts.items(),
                                                                      reverse=True))


def _rounds(result: dict) -> str:
    counts = sorted({r.get("rounds") or result["rounds"] for r in result["rows"]} or
                    {result["rounds"]})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def markdown(result: dict) -> str:
    lines = [f"# Models with and without opselect.enable() on {result['device']}", "",
             f"torch {result['torch']}, triton {result['triton']}, transformers "
             f"{result['transformers']}, {_dates(result)}. Median ms per call [min-max] over "
             f"{_rounds(result)} rounds taken in turns; ratio = without / with (> 1: faster "
             f"with opselect); 'noise' where the medians differ by less than a variant's own "
             f"range. forward: {result['tokens']} tokens (forward-long: "
             f"{result['long_tokens']}); decode: one token against a static KV cache of "
             f"{result['tokens']}, then generate's top-k (50) or top-p (0.9) sampling.", "",
             "| model | batch | phase | mode | without | with | ratio | what moved (us without "
             "-> with) |", "|---|---|---|---|---|---|---|---|"]

    def cell(v):
        return f"{v['median_ms']:.3f} [{v['min_ms']:.3f}-{v['max_ms']:.3f}]"

    for r in result["rows"]:
        if "ratio" not in r:
            lines.append(f"| {r.get('model')} | {r['batch']} | {r['phase']} | {r['mode']} | "
                         f"failed: {r.get('error', '?')[:80]} | | | |")
            continue
        moved = "; ".join(f"{n} {a:g} -> {b:g}" for n, a, b in r.get("moved", [])[:3])
        lines.append(f"| {r['model']} | {r['batch']} | {r['phase']} | {r['mode']} | "
                     f"{cell(r['without'])} | {cell(r['with'])} | {r['ratio']:.3f}"
                     f"{'' if r['beyond_spread'] else ' (noise)'} | {moved} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Ratio without / with per cell, one bar each, grouped by mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in result["rows"] if "ratio" in r]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows)), 4))
    colors = {"eager": "tab:blue", "compile": "tab:orange", "reduce-overhead": "tab:green"}
    labels = [f"{r['model']} b{r['batch']} {r['phase']}" for r in rows]
    ax.bar(range(len(rows)), [r["ratio"] for r in rows],
           color=[colors.get(r["mode"], "gray") for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
    ax.set_ylabel("time without / with opselect")
    ax.set_title(f"opselect.enable() on {result['device']}")
    # (legend patches of their own: empty bar containers carry no colour into a legend)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=color, label=mode) for mode, color in colors.items()],
              fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed (pip install -e '.[hf]'): nothing to run")
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "model.json").write_text(
                json.dumps({"skipped": "transformers is not installed", "rows": []}))
        return
    if args.smoke:
        args.models, args.batches, args.rounds = "gpt2,llama3-8b", "2", 2
        args.phases, args.modes, args.block_ms = "forward,decode-topk,decode-topp", "eager,compile", 1.0
    result = run(args)
    print(markdown(result))
    bad = [r for r in result["rows"] if "error" in r]
    if args.smoke and bad:
        raise SystemExit(f"smoke run failed: {bad}")


if __name__ == "__main__":
    main()
