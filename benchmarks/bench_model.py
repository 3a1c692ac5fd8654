"""A Hugging Face model with and without opselect.enable(): forward and decode-step time, eager
and compiled (needs the `hf` extra: pip install -e '.[hf]').

The model is built from a config with random weights (no download) and eager attention, so its
softmax is a torch call opselect can route; the heads are merged by copying a transposed view
(a permute). A decode step is one token through the model against the KV cache of --prompt
tokens, then top-k sampling as `generate(do_sample=True, top_k=50)` does it (topk,
masked softmax, multinomial). Timed (median ms of do_bench on the GPU):

  eager            the model as it is
  eager+opselect   the same under opselect.enable()
  compiled         torch.compile (inductor, default mode) of the same function
  compiled+opselect  compiled under opselect.enable() (the rule of opselect/library.py decides
                   per call: aten op or opselect's)

Results: benchmarks/results/<gpu>/model.{json,md} and $OUT.

    python benchmarks/bench_model.py                         # GPT-2 small shape, batch 8 and 64
    python benchmarks/bench_model.py --model llama --batch 8,32
    python benchmarks/bench_model.py --smoke                  # a tiny model on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, gpu_slug, save_result, timer  # noqa: E402

import opselect  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny model on any device (CI)")
    p.add_argument("--model", default="gpt2", choices=("gpt2", "llama"))
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", default="8,64", help="comma list of batch sizes")
    p.add_argument("--prompt", type=int, default=128, help="tokens of the forward pass / cache")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--merge", action="store_true",
                   help="keep the saved rows of other batch sizes (one run per batch size)")
    return p.parse_args(argv)


def build(kind: str, layers: int, smoke: bool):
    import transformers

    if smoke:
        size = dict(hidden=32, heads=2, vocab=256, positions=64, inner=64)
    else:
        size = dict(hidden=768, heads=12, vocab=50257, positions=1024, inner=3072)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=layers, n_head=size["heads"], n_embd=size["hidden"],
                                      vocab_size=size["vocab"], n_positions=size["positions"],
                                      attn_implementation="eager", pad_token_id=0)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, num_attention_heads=size["heads"],
                                   num_key_value_heads=max(1, size["heads"] // 3),
                                   hidden_size=size["hidden"], intermediate_size=size["inner"],
                                   vocab_size=size["vocab"],
                                   max_position_embeddings=size["positions"],
                                   attn_implementation="eager", pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


def sample_top_k(logits: torch.Tensor, k: int = 50) -> torch.Tensor:
    """generate(do_sample=True, top_k=k)'s step: keep the k best scores, softmax, draw one."""
    kth = torch.topk(logits, k)[0][..., -1, None]
    scores = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.nn.functional.softmax(scores.float(), dim=-1)
    return torch.multinomial(probs, num_samples=1)


def workloads(model, batch: int, prompt: int, device: torch.device):
    """{"forward": fn, "decode": fn}: each call does the same work (the decode step appends one
    token to the KV cache of the prompt, then crops it back)."""
    vocab = model.config.vocab_size
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(3, vocab, (batch, prompt), device=device, generator=gen)
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    last = ids[:, -1:].clone()

    def forward():
        with torch.no_grad():
            return model(ids).logits

    def decode():
        with torch.no_grad():
            logits = model(last, past_key_values=cache, use_cache=True).logits[:, -1, :]
            cache.crop(-1)
            return sample_top_k(logits)

    return {"forward": forward, "decode": decode}


def run(args: argparse.Namespace) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if args.smoke or device.type == "cpu" else getattr(torch, args.dtype)
    layers = 2 if args.smoke else args.layers
    batches = [2] if args.smoke else [int(b) for b in args.batch.split(",")]
    prompt = 8 if args.smoke else args.prompt
    backend = "aot_eager" if args.smoke else "inductor"
    time_ms = timer(device, 5.0 if args.smoke else args.rep_ms, 1 if args.smoke else 2)
    torch.manual_seed(0)
    model = build(args.model, layers, args.smoke).to(device=device, dtype=dtype).eval()
    rows = []
    for batch in batches:
        work = workloads(model, batch, prompt, device)
        for phase, fn in work.items():
            row = {"model": args.model, "batch": batch, "phase": phase, "ms": {}, "errors": {}}
            variants = {"eager": (fn, False), "eager+opselect": (fn, True)}
            if not args.no_compile:
                torch._dynamo.reset()
                compiled = torch.compile(fn, backend=backend)
                variants["compiled"] = (compiled, False)
                variants["compiled+opselect"] = (compiled, True)
            for name, (call, routed) in variants.items():
                opselect.reset_stats()
                try:
                    with opselect.enabled() if routed else nullcontext():
                        torch.manual_seed(0)
                        call()
                        row["ms"][name] = time_ms(call)
                except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                    row["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    print(f"  !! {args.model} batch {batch} {phase}: {name} failed: "
                          f"{row['errors'][name]}", flush=True)
                if routed:
                    row.setdefault("opselect_calls", {})[name] = {
                        op: s["backends"] or s["traced"] for op, s in opselect.stats().items()}
            ms = row["ms"]
            if ms.get("eager") and ms.get("eager+opselect"):
                row["eager_speedup"] = ms["eager"] / ms["eager+opselect"]
            if ms.get("compiled") and ms.get("compiled+opselect"):
                row["compiled_speedup"] = ms["compiled"] / ms["compiled+opselect"]
            rows.append(row)
            print(f"{args.model} batch {batch:<3} {phase:<8} "
                  + " ".join(f"{k}={v:.4g}" for k, v in ms.items()), flush=True)
            torch._dynamo.reset()
    import triton

    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "gpu": gpu_slug(device), "model": args.model, "layers": layers,
            "dtype": str(dtype)[6:], "prompt": prompt, "compile_backend": backend,
            "torch": torch.__version__, "triton": triton.__version__,
            "transformers": __import__("transformers").__version__,
            "python": platform.python_version(), "opselect": opselect.__version__,
            "date": time.strftime("%Y-%m-%d"), "smoke": args.smoke, "rows": rows}


def markdown(result: dict) -> str:
    out = [f"# {result['model']} ({result['layers']} layers, {result['dtype']}) with and without "
           f"opselect on {result['device']}", "",
           f"torch {result['torch']}, triton {result['triton']}, transformers "
           f"{result['transformers']}, {result['date']}. forward: {result['prompt']} tokens; "
           f"decode: one token against a KV cache of {result['prompt']} and top-k "
           "sampling (k = 50). Median ms; speedup = time without / time with opselect.", "",
           "| batch | phase | eager | eager+opselect | speedup | compiled | compiled+opselect "
           "| speedup |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ms = r["ms"]

        def cell(k):
            return "-" if ms.get(k) is None else f"{ms[k]:.4g}"

        def ratio(k):
            return "-" if r.get(k) is None else f"{r[k]:.3f}"

        out.append(f"| {r['batch']} | {r['phase']} | {cell('eager')} | {cell('eager+opselect')}"
                   f" | {ratio('eager_speedup')} | {cell('compiled')} | "
                   f"{cell('compiled+opselect')} | {ratio('compiled_speedup')} |")
    out += ["", "Backends that ran under opselect.enable() (eager) / trace-time placements "
            "(compiled), per case:", ""]
    for r in result["rows"]:
        out.append(f"- batch {r['batch']} {r['phase']}: {r.get('opselect_calls', {})}")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed (pip install -e '.[hf]'): nothing to run")
        result = {"skipped": "transformers is not installed", "rows": []}
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "model.json").write_text(json.dumps(result))
        return
    result = run(args)
    md = markdown(result)
    stem = "model" if result["model"] == "gpt2" else f"model_{result['model']}"
    saved = RESULTS / result["gpu"] / f"{stem}.json"
    if args.merge and saved.exists():
        done = {(r["batch"], r["phase"]) for r in result["rows"]}
        kept = [r for r in json.loads(saved.read_text())["rows"]
                if (r["batch"], r["phase"]) not in done]
        result["rows"] = sorted(kept + result["rows"], key=lambda r: (r["batch"], r["phase"]))
        md = markdown(result)
    save_result(stem, result, md, result["gpu"], not args.no_save and not args.smoke)
    print(md)


if __name__ == "__main__":
    main()
