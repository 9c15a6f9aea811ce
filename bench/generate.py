"""Generation speed of this core against transformers on the same weights, side by side in one run.

Prints tokens/s for 128 greedy tokens (medians of alternating runs, with their range, and the ratio), prefill
time at 512 and 2048 tokens, and tokens/s with and without the KV cache at 256 and 1024 tokens of context.
--compile adds this core's decode step through torch.compile (CUDA graphs on a GPU). On a GPU it also prints
the fraction of the memory-bandwidth limit reached. With --publish the table goes to docs/benchmarks.md
(section generate). Usage:
    python bench/generate.py [--model smollm2-135m-instruct] [--device cpu|cuda] [--dtype float32|bfloat16]
                             [--tokens 128] [--repeats 5] [--compile] [--random-weights] [--publish]
"""
from __future__ import annotations

import argparse

import torch

from common import add_publish, load_both, long_ids, md_table, median, publish, row, spread, timed
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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also time the compiled decode step")
    parser.add_argument("--random-weights", action="store_true",
                        help="the model's shapes with seeded random weights (bench/configs/), for machines without it")
    add_publish(parser)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    ours, theirs, folder = load_both(args.model, args.device, dtype, random_weights=args.random_weights)
    tok = ours.tokenizer
    if tok is not None:
        prompt = chat_ids(tok, "Explain in detail how attention works in a transformer.").to(args.device)
    else:
        prompt = long_ids(None, 40).to(args.device)
    n = args.tokens
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    print(f"model {args.model} ({folder}{', random weights' if args.random_weights else ''}), device {name}, "
          f"dtype {dtype}, threads {torch.get_num_threads()}, torch {torch.__version__}")

    # 1. tokens/s, greedy, alternating so that every variant sees the same machine state
    variants = {"this core": lambda k: ours_greedy(ours, prompt, k), "transformers": lambda k: theirs_greedy(theirs, prompt, k)}
    if args.compile:
        variants["this core, compiled"] = lambda k: ours.generate(prompt, k, compile=True)
    for run in variants.values():  # warm-up (and the one compile)
        run(n)
    rates = {key: [] for key in variants}
    for _ in range(args.repeats):
        for key, run in variants.items():
            t, out = timed(lambda: run(n), args.device)
            rates[key].append((out.shape[1] - prompt.shape[1]) / t)
    gen_ratio = median(rates["this core"]) / median(rates["transformers"])
    print(f"greedy tokens/s, {n} tokens, median (range) of {args.repeats} alternating runs:")
    for key, values in rates.items():
        ratio = median(values) / median(rates["transformers"])
        print(row(f"  {key}", spread(values), "", f"{ratio:.2f}x"))
    reference = theirs_greedy(theirs, prompt, 32)[:, :prompt.shape[1] + 32]
    print(f"  same 32 greedy tokens as transformers: {torch.equal(ours_greedy(ours, prompt, 32), reference)}")

    # 2. prefill: one forward pass over a long prompt, logits of the last position
    table = [[f"greedy decoding, {n} tokens (tokens/s)", spread(rates["this core"]), spread(rates["transformers"]),
              f"{gen_ratio:.2f}×"]]
    if args.compile:
        table.append(["the same, decode step compiled (`compile=True`)", spread(rates["this core, compiled"]), "",
                      f"{median(rates['this core, compiled']) / median(rates['transformers']):.2f}×"])
    prefill = {}
    print(row("", "this core", "transformers", "ratio"))
    for length in (512, 2048):
        ids = long_ids(tok, length).to(args.device)
        ours_s, theirs_s = [], []
        with torch.inference_mode():
            for _ in range(args.repeats):
                ours_s.append(timed(lambda: ours.logits(ours.run_stack(ours.stack, ids, None, kind="self")[:, -1:]),
                                    args.device)[0])
                theirs_s.append(timed(lambda: theirs(ids, logits_to_keep=1), args.device)[0])
        prefill[length] = median(theirs_s) / median(ours_s)
        print(row(f"prefill {length} tokens (s)", spread(ours_s, 3), spread(theirs_s, 3), f"{prefill[length]:.2f}x"))
        table.append([f"prefill, {length} tokens (s)", spread(ours_s, 3), spread(theirs_s, 3),
                      f"{prefill[length]:.2f}× its speed"])

    # 3. the KV cache: tokens/s at a given context with and without it (this core both times)
    cache_gain = {}
    for context in (256, 1024):
        ids = long_ids(tok, context).to(args.device)
        steps, extra = 16, 4
        with_cache, _ = timed(lambda: ours.generate(ids, steps), args.device)

        def naive():
            seq = ids
            for _ in range(extra):
                seq = torch.cat([seq, no_cache_step(ours, seq)[:, None]], dim=1)
        without, _ = timed(naive, args.device)
        cache_gain[context] = (steps / with_cache) / (extra / without)
        print(row(f"tokens/s at {context} context", f"cache {steps / with_cache:.1f}", f"none {extra / without:.2f}",
                  f"{cache_gain[context]:.1f}x"))
        table.append([f"new tokens after {context} tokens of context, with / without the KV cache (tokens/s, "
                      f"{steps} / {extra} tokens, once)", f"{steps / with_cache:.1f} / {extra / without:.2f}", "",
                      f"{cache_gain[context]:.1f}×"])

    bandwidth = ""
    if args.device.startswith("cuda"):
        weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
        peak = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s, the makers' figures
        bw = next((v for k, v in peak.items() if k in name), None)
        if bw:
            limit = bw / weight_bytes
            best = max(median(v) for k, v in rates.items() if k != "transformers")
            bandwidth = f", {best / limit:.1%} of the bandwidth limit"
            print(f"memory-bandwidth limit ≈ {limit:.0f} tokens/s ({name}, weights read once per token); "
                  f"fastest variant reached {best / limit:.1%}")
    compiled = ""
    if args.compile:
        compiled = f", compiled {median(rates['this core, compiled']) / median(rates['transformers']):.2f}x"
    print(f"SUMMARY generate ({name}, {dtype}): tokens/s ratio {gen_ratio:.2f}x{compiled}{bandwidth}, "
          f"prefill 512 {prefill[512]:.2f}x, prefill 2048 {prefill[2048]:.2f}x, "
          f"kv-cache gain 256 {cache_gain[256]:.1f}x, 1024 {cache_gain[1024]:.1f}x")
    if args.publish:
        publish("generate", f"{args.model}, {name}, {str(dtype).removeprefix('torch.')}, "
                            f"{torch.get_num_threads()} thread(s): median (range) of {args.repeats} runs alternating "
                            "between the sides; ratio = this core's speed / transformers' (its SDPA attention). The "
                            "KV-cache rows time one run each, the first pass over the context included; without the "
                            "cache every step runs the whole prefix again.\n\n" +
                md_table(["", "this core", "transformers", "ratio"], table, ["---", "---:", "---:", "---:"]))


if __name__ == "__main__":
    main()
