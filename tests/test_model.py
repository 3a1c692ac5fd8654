"""A real client: Hugging Face transformers models (built from a config, random weights, no
download) under opselect.enable(): the same logits and the same sampled tokens as without it, and
every op the model calls went through opselect. Needs the `hf` extra (pip install -e '.[hf]')."""

from __future__ import annotations

import pytest
import torch

import opselect

transformers = pytest.importorskip("transformers")

# Triton kernels forced in the CPU test (the cost model picks torch's kernels on the CPU).
KERNELS = {"softmax": "fused", "topk": "bitonic", "permute": "naive", "isin": "compare"}


def tiny(kind: str, **overrides):
    """A two-layer model small enough for Triton's interpreter."""
    common = dict(vocab_size=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  attn_implementation="eager")
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64,
                                      **{**common, **overrides})
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, hidden_size=32, intermediate_size=64,
                                   max_position_embeddings=64, **{**common, **overrides})
    return transformers.LlamaForCausalLM(cfg)


def run(model, ids, new_tokens: int, seed: int = 1):
    with torch.no_grad():
        logits = model(ids).logits
        torch.manual_seed(seed)
        tokens = model.generate(ids, do_sample=True, top_k=50, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens)
    return logits, tokens


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.slow
def test_tiny_model_same_logits_and_tokens(cpu_triton, kind):
    torch.manual_seed(0)
    model = tiny(kind).eval()
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    logits, tokens = run(model, ids, 5)
    opselect.reset_stats()
    with opselect.enabled(backends=KERNELS):
        got_logits, got_tokens = run(model, ids, 5)
    torch.testing.assert_close(got_logits, logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_tokens, tokens)
    stats = opselect.stats()
    # Attention softmax of every layer, the sampler's softmax and top-k, the heads merged by a
    # copy of a transposed view (prefill), and the stopping criteria's isin.
    for op in ("softmax", "topk", "permute", "isin"):
        assert stats[op]["backends"] == {KERNELS[op]: stats[op]["calls"]}, stats
        assert stats[op]["calls"] > 0
    assert stats["topk"]["calls"] == 5  # one per sampled token


def test_tiny_model_auto(cpu_triton):
    """With no backend forced, the dispatcher's choice (torch's kernels on the CPU) runs, and
    the results are exactly torch's."""
    torch.manual_seed(0)
    model = tiny("gpt2").eval()
    ids = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    logits, tokens = run(model, ids, 3)
    with opselect.enabled():
        got_logits, got_tokens = run(model, ids, 3)
    assert torch.equal(got_logits, logits) and torch.equal(got_tokens, tokens)
    assert {op for op, s in opselect.stats().items() if s["calls"]} >= {"softmax", "topk",
                                                                       "permute"}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.slow
def test_tiny_model_compiled_fullgraph(cpu_triton, kind):
    """The whole model compiles as one graph under enable(), with opselect's kernels in it."""
    torch.manual_seed(0)
    model = tiny(kind).eval()
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    forced = {"softmax": "fused", "permute": "naive"}
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        opselect.reset_stats()
        with opselect.enabled(backends=forced):
            routed = torch.compile(model, backend="aot_eager", fullgraph=True)(ids).logits
    torch.testing.assert_close(routed, eager, rtol=1e-5, atol=1e-5)
    stats = opselect.stats()
    for op, backend in forced.items():
        assert stats[op]["traced"].get("opselect") and stats[op]["backends"] == {
            backend: 2}, stats  # one call per layer


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_gpu_model(cuda, kind):
    """A GPT-2-small-sized model (12 layers, vocabulary 50257) on the GPU, batch 8, eager: the
    same logits and sampled tokens with and without opselect."""
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257,
                                      attn_implementation="eager", pad_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=12, num_attention_heads=12,
                                       num_key_value_heads=4, hidden_size=768,
                                       intermediate_size=2048, vocab_size=50257,
                                       attn_implementation="eager", pad_token_id=0)
        model = transformers.LlamaForCausalLM(cfg)
    model = model.cuda().eval()
    ids = torch.randint(3, 50257, (8, 64), device="cuda")
    logits, tokens = run(model, ids, 16)
    opselect.reset_stats()
    with opselect.enabled():
        got_logits, got_tokens = run(model, ids, 16)
    torch.testing.assert_close(got_logits, logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(got_tokens, tokens)
    stats = opselect.stats()
    for op in ("softmax", "topk", "permute"):
        assert stats[op]["calls"] > 0, stats


@pytest.mark.gpu
def test_gpu_model_compiled(cuda):
    """torch.compile of a two-layer GPT-2 with the real vocabulary, with and without enable():
    the same logits (the compile is kept short; the 12-layer model runs in bench_model.py)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=12, n_embd=768, vocab_size=50257,
                                  attn_implementation="eager", pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).cuda().eval()
    ids = torch.randint(3, 50257, (8, 64), device="cuda")
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        compiled = torch.compile(model)
        plain = compiled(ids).logits
        torch._dynamo.reset()
        opselect.reset_stats()
        with opselect.enabled():
            routed = compiled(ids).logits
    torch.testing.assert_close(routed, plain, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(routed, eager, rtol=1e-3, atol=1e-3)
    traced = opselect.stats()
    assert traced["softmax"]["traced"] and traced["permute"]["traced"], traced
