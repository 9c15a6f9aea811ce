"""Generation speed of this core against transformers on the same weights, side by side in one run.

Prints tokens/s for 128 greedy tokens (and the ratio), prefill time at 512 and 2048 tokens, and
tokens/s with and without the KV cache at 256 and 1024 tokens of context. Usage:
    python bench/generate.py [--model smollm2-135m-instruct] [--device cpu|cuda] [--dtype float32|bfloat16]
"""
from __future__ import annotations

import argparse

import torch

from common import load_both, long_ids, median, row, timed
from core.generate import chat_ids


def ours_greedy(model, ids, n):
    return model.generate(ids, n)


def theirs_greedy(model, ids, n):
    with torch.inference_mode():
        return model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                              pad_token_id=model.config.eos_token_id)


def no_cache_step(model, ids):
    """One new token the naive way: the whole prefix through the model again."""
    return model(ids).logits[:, -1].argmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 (cpu default) or bfloat16 (cuda default)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    ours, theirs, folder = load_both(args.model, args.device, dtype)
    tok = ours.tokenizer
    prompt = chat_ids(tok, "Explain in detail how attention works in a transformer.").to(args.device)
    n = args.tokens
    print(f"model {args.model} ({folder}), device {args.device}, dtype {dtype}, threads {torch.get_num_threads()}")

    # 1. tokens/s, 128 greedy tokens, alternating so both see the same machine state
    ours_greedy(ours, prompt, 8), theirs_greedy(theirs, prompt, 8)  # warm-up
    ours_t, theirs_t = [], []
    for _ in range(args.repeats):
        t, out = timed(lambda: ours_greedy(ours, prompt, n), args.device)
        ours_t.append((out.shape[1] - prompt.shape[1]) / t)
        t, out = timed(lambda: theirs_greedy(theirs, prompt, n), args.device)
        theirs_t.append((out.shape[1] - prompt.shape[1]) / t)
    gen_ratio = median(ours_t) / median(theirs_t)
    same = torch.equal(ours_greedy(ours, prompt, 32), theirs_greedy(theirs, prompt, 32)[:, :prompt.shape[1] + 32])
    print(row("", "this core", "transformers", "ratio"))
    print(row(f"greedy tokens/s ({n} tokens)", f"{median(ours_t):.1f}", f"{median(theirs_t):.1f}", f"{gen_ratio:.2f}x"))
    print(f"  (same 32 greedy tokens: {same})")

    # 2. prefill: one forward pass over a long prompt, logits of the last position
    prefill = {}
    for length in (512, 2048):
        ids = long_ids(tok, length).to(args.device)
        with torch.inference_mode():
            ours_s = median([timed(lambda: ours.logits(ours.run_stack(ours.stack, ids, None, kind="self", causal=True,
                                                                      padding_mask=True, scale=True, positions=True)[:, -1:]),
                                   args.device)[0] for _ in range(2)])
            theirs_s = median([timed(lambda: theirs(ids, logits_to_keep=1), args.device)[0] for _ in range(2)])
        prefill[length] = theirs_s / ours_s
        print(row(f"prefill {length} tokens (s)", f"{ours_s:.3f}", f"{theirs_s:.3f}", f"{theirs_s / ours_s:.2f}x"))

    # 3. the KV cache: tokens/s at a given context with and without it (this core both times)
    cache_gain = {}
    for context in (256, 1024):
        ids = long_ids(tok, context).to(args.device)
        steps = 16
        with_cache, _ = timed(lambda: ours.generate(ids, steps), args.device)
        extra = 4
        def naive():
            seq = ids
            for _ in range(extra):
                seq = torch.cat([seq, no_cache_step(ours, seq)[:, None]], dim=1)
        without, _ = timed(naive, args.device)
        cache_gain[context] = (steps / with_cache) / (extra / without)
        print(row(f"tokens/s at {context} context", f"cache {steps / with_cache:.1f}", f"none {extra / without:.2f}",
                  f"{cache_gain[context]:.1f}x"))

    if args.device.startswith("cuda"):
        weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
        peak = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s, the makers' figures
        name = torch.cuda.get_device_name(0)
        bw = next((v for k, v in peak.items() if k in name), None)
        if bw:
            limit = bw / weight_bytes
            print(f"memory-bandwidth limit ≈ {limit:.0f} tokens/s ({name}); reached {median(ours_t) / limit:.1%}")
    print(f"SUMMARY generate: tokens/s ratio {gen_ratio:.2f}x (target ≥ 1.5x on cpu fp32), "
          f"prefill 512 {prefill[512]:.2f}x, prefill 2048 {prefill[2048]:.2f}x, "
          f"kv-cache gain 256 {cache_gain[256]:.1f}x, 1024 {cache_gain[1024]:.1f}x")


if __name__ == "__main__":
    main()
