"""Speed of activation patching, direct logit attribution and the flow graph (core/analysis/patching.py) on a real
model, beside the plain way, in one run: medians (and ranges) of alternating runs.

  resid_pre    every layer × position of the residual stream patched on the 14-token IOI pair (420 patches),
               against one forward pass per patch (timed on every 10th patch and scaled to all of them) and,
               where transformer-lens is installed (requirements-bench.txt), its get_act_patch_resid_pre
  heads        every head's output patched at all positions (the z sweep)
  attribution  direct logit attribution of every head and MLP
  flow graph   the information-flow graph of the last token of a 64-token text
With --publish the table goes to docs/benchmarks.md (section patching).
Usage: python bench/patching.py [--model smollm2-135m-instruct] [--repeats 5] [--flow-tokens 64] [--publish]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TQDM_DISABLE", "1")   # transformer-lens draws a bar per sweep; read when tqdm is imported

import torch  # noqa: E402

from common import add_publish, long_ids, md_table, median, publish, row, spread, timed  # noqa: E402
from core import load_model  # noqa: E402
from core.analysis import patching  # noqa: E402
from core.probe import Patch  # noqa: E402
from core.store import ensure  # noqa: E402

IOI = ("When Mary and John went to the store, John gave a drink to",
       "When Mary and John went to the store, Mary gave a drink to")
WIDTHS = (46, 22, 22, 9)


def one_pass_per_patch(model, clean, corrupted, cells) -> None:
    """The plain way: a whole forward pass of the corrupted prompt for each patched (layer, position)."""
    with torch.inference_mode():
        source = model(clean, record="resid_pre").records["resid_pre"]
        for layer, position in cells:
            where = torch.zeros(1, clean.shape[1], 1, dtype=torch.bool)
            where[:, position] = True
            model(corrupted, patches=[Patch("resid_pre", layer, source[layer], where)])


def transformer_lens_sweep(folder, model, clean, corrupted, answer, foil):
    """get_act_patch_resid_pre on the same weights (TransformerLens 4's TransformerBridge, or 3's
    HookedTransformer), or None where transformer-lens is not installed."""
    try:
        import transformer_lens
        from transformer_lens import patching as tl_patching
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    try:
        from transformer_lens.model_bridge import TransformerBridge
        tl = TransformerBridge.boot_transformers(str(folder), hf_model=hf, tokenizer=model.tokenizer, device="cpu")
    except ImportError:
        tl = transformer_lens.HookedTransformer.from_pretrained_no_processing(
            "HuggingFaceTB/SmolLM2-135M-Instruct", hf_model=hf, tokenizer=model.tokenizer, device="cpu")
    _, cache = tl.run_with_cache(clean)

    def metric(logits):
        return logits[0, -1, answer] - logits[0, -1, foil]

    return lambda: tl_patching.get_act_patch_resid_pre(tl, corrupted, cache, metric).detach()


def transformer_lens_version() -> str:
    from importlib.metadata import version
    return version("transformer-lens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--flow-tokens", type=int, default=64)
    add_publish(parser)
    args = parser.parse_args()
    folder = ensure(args.model)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    tok, cfg = model.tokenizer, model.config
    clean, corrupted = (torch.tensor([tok(t, add_special_tokens=False).input_ids]) for t in IOI)
    answer, foil = tok(" Mary", add_special_tokens=False).input_ids[0], tok(" John", add_special_tokens=False).input_ids[0]
    n = clean.shape[1]
    cells = [(l, p) for l in range(cfg.n_layers) for p in range(n)]
    sample = cells[::10]
    flow_ids = long_ids(tok, args.flow_tokens)
    print(f"model {args.model} ({folder}), cpu, float32, threads {torch.get_num_threads()}, IOI pair of {n} tokens "
          f"({len(cells)} residual patches), flow graph on {args.flow_tokens} tokens, medians (ranges) of "
          f"{args.repeats} runs")
    theirs = transformer_lens_sweep(folder, model, clean, corrupted, answer, foil)
    patching.patch_sweep(model, clean, corrupted, answer, foil, "z", layer=0)      # warm-up
    times = {key: [] for key in ("sweep", "per patch", "transformer-lens", "heads", "attribution", "flow")}
    for _ in range(args.repeats):
        times["sweep"].append(timed(lambda: patching.patch_sweep(model, clean, corrupted, answer, foil,
                                                                 "resid_pre"), "cpu")[0])
        per_patch = timed(lambda: one_pass_per_patch(model, clean, corrupted, sample), "cpu")[0] / len(sample)
        times["per patch"].append(per_patch * len(cells))
        if theirs is not None:
            seconds, tl_map = timed(theirs, "cpu")
            times["transformer-lens"].append(seconds)
        times["heads"].append(timed(lambda: patching.patch_sweep(model, clean, corrupted, answer, foil, "z"),
                                    "cpu")[0])
        times["attribution"].append(timed(lambda: patching.logit_attribution(model, corrupted, answer, foil),
                                          "cpu")[0])
        times["flow"].append(timed(lambda: patching.flow_graph(model, flow_ids), "cpu")[0])
    ratio = median(times["per patch"]) / median(times["sweep"])
    print(row("", "this core (s)", "plain way (s)", "ratio", widths=WIDTHS))
    print(row(f"resid_pre sweep, {len(cells)} patches", spread(times["sweep"], 2), spread(times["per patch"], 1),
              f"{ratio:.1f}x", widths=WIDTHS))
    table = [[f"`resid_pre` sweep, {len(cells)} patches", f"{spread(times['sweep'], 2)} s",
              f"one forward pass per patch: {spread(times['per patch'], 1)} s", f"{ratio:.1f}×"]]
    tl_note = "transformer-lens not installed"
    if times["transformer-lens"]:
        tl_ratio = median(times["transformer-lens"]) / median(times["sweep"])
        print(row("  against transformer-lens get_act_patch_resid_pre", "", spread(times["transformer-lens"], 1),
                  f"{tl_ratio:.1f}x", widths=WIDTHS))
        ours = patching.patch_sweep(model, clean, corrupted, answer, foil, "resid_pre").metrics
        print(f"  the two maps of logit differences agree to {(tl_map - ours).abs().max().item():.2g} (largest gap)")
        tl_note = f"{tl_ratio:.1f}x transformer-lens"
        gap = (tl_map - ours).abs().max().item()
        table.append([f"the same against transformer-lens {transformer_lens_version()} `get_act_patch_resid_pre` "
                      f"(maps agree to {gap:.2g})", "", f"{spread(times['transformer-lens'], 1)} s", f"{tl_ratio:.1f}×"])
    print(row(f"head sweep, {cfg.n_layers * cfg.n_heads} heads", spread(times["heads"], 2), "", "", widths=WIDTHS))
    print(row("direct logit attribution", spread(times["attribution"], 2), "", "", widths=WIDTHS))
    print(row(f"flow graph, {args.flow_tokens} tokens", spread(times["flow"], 2), "", "", widths=WIDTHS))
    if args.publish:
        table += [[f"head sweep, {cfg.n_layers * cfg.n_heads} heads at every position", f"{spread(times['heads'], 2)} s",
                   "", ""],
                  ["direct logit attribution", f"{spread(times['attribution'], 2)} s", "", ""],
                  [f"flow graph, {args.flow_tokens} tokens (heads summed per token edge)",
                   f"{spread(times['flow'], 2)} s", "", ""]]
        publish("patching", f"{args.model}, cpu, float32, {torch.get_num_threads()} thread(s), the {n}-token IOI pair; "
                            f"median (range) of {args.repeats} runs alternating between the sides. The plain way's "
                            f"time is measured on every 10th patch ({len(sample)}) and scaled to {len(cells)}. "
                            + ("" if times["transformer-lens"] else "transformer-lens was not installed in this run, "
                               "so its row is left out. ") + "\n\n" +
                md_table(["", "this core", "the plain way", "ratio"], table, ["---", "---:", "---:", "---:"]))
    print(f"SUMMARY patching: resid_pre sweep {median(times['sweep']):.2f} s, {ratio:.1f}x one pass per patch "
          f"(target ≥ 10x), {tl_note}; head sweep {median(times['heads']):.2f} s (≤ 5); flow graph "
          f"{median(times['flow']):.2f} s (≤ 3)")


if __name__ == "__main__":
    main()
