"""Attention sinks, softmax against a learned sink: the Lab's small decoder trained twice on the same task, once with plain softmax
and once with a learned sink in every softmax's denominator, then measured the same way.

    python -m core.lab.sinks [--steps 3000] [--seed 0] [--window 8] [--threads 1] [--out assets/sinks_lab]

The sink is one more entry in each row's denominator with no value, P = exp(S) / (Σ exp(S) + exp(s)), so a head can
put its weight nowhere instead of on a token (core/attention.py). By default s = q·k_s/√d_k, a learned key per head
that each query scores as it scores a key (a key-only sink token, as Gu et al., ICLR 2025, train one); sink="logit"
makes s one learned number per head (gpt-oss's form, which this task showed losing the race to <bos>: one number
cannot tell the rows that need the sink from those that need a key). Both runs get the same model (core.lab.train's
decoder-only Llama layout: Pre-LN, RMSNorm, SwiGLU, RoPE), the same seed, the same batches and the same number of
steps.

The task gives a head work only sometimes (after Guo et al. 2024, "Active-Dormant Attention Heads", whose
bigram-backcopy task it simplifies): after <bos>, letters are drawn uniformly at random, except after the trigger
letters q, x and z, where the next letter copies the letter before the trigger. A head that fetches that letter has
nothing to fetch after any other letter, where nothing in the text predicts the next one; with softmax its weights
must still sum to 1, and a weight spread over the letters would bias the prediction towards them.

Measured on held-out sequences (another random stream): each head's mean attention on the first token (<bos>) over
queries 1..T−1 and the share of heads above ε = 0.3 (core.analysis.sinks.sink_scores, Gu et al.'s Sink^ε); the
weight the learned sink takes; and the perplexity of the sequences with full attention, with every query reading
only its last `window` keys, and with the window plus <bos> (core.analysis.sinks.streaming_perplexity, text
positions).

Float sums depend on the thread count, and hundreds of steps carry those bits into different weights: a run repeats
exactly at the same thread count only; the result records it, and --threads sets it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from .. import train as lab_engine
from ...analysis.sinks import EPSILON, sink_scores, streaming_perplexity
from ..train import BOS, INDEX, LabConfig

KINDS = ("softmax", "sink")
READS = ("full", "window", "window + <bos>")   # how the held-out text is read


@dataclass(frozen=True)
class SinksLabConfig:
    steps: int = 3000
    seed: int = 0
    window: int = 8           # the keys each query reads in the window-only tests
    context: int = 32         # tokens per sequence: <bos> and 31 letters
    batch: int = 64
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    lr: float = 3e-3
    warmup: int = 50
    test_texts: int = 24      # held-out sequences measured
    sink: str = "key"         # the sink kind's sink: "key", a learned key per head with no value (scored by each
                              # query, as a key-only token is), or "logit", one learned logit per head (gpt-oss)

    def check(self) -> None:
        if self.sink not in ("key", "logit"):
            raise ValueError(f"sink must be 'key' or 'logit', got {self.sink!r}")
        for name, value, low, high in (("steps", self.steps, 1, 20_000), ("context", self.context, 8, 512),
                                       ("window", self.window, 1, self.context - 2),
                                       ("test_texts", self.test_texts, 2, 200), ("seed", self.seed, 0, 2**31 - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}")

    def lab(self, kind: str) -> LabConfig:
        """The Lab's decoder for one kind; the task field is unused (the batches are text)."""
        return LabConfig(family="llama", n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                         d_ff=self.d_ff, steps=self.steps, batch=self.batch, lr=self.lr, warmup=self.warmup,
                         seed=self.seed, max_len=self.context, sinks=self.sink if kind == "sink" else "")


@dataclass
class KindResult:
    """One kind trained and measured. first / learned: [L][H] means over the held-out texts, with their 95 %
    intervals (first_low/high); share: Sink^ε, the share of heads whose mean attention on <bos> exceeds ε;
    perplexity[read] over all held-out predictions, past_window[read] over those made by queries at places ≥ window
    (the ones a window hides something from)."""
    kind: str
    steps: int
    seconds: float
    train_loss: float
    first: list[list[float]]
    first_low: list[list[float]]
    first_high: list[list[float]]
    share: float
    learned: list[list[float]] | None
    perplexity: dict[str, float] = field(default_factory=dict)
    past_window: dict[str, float] = field(default_factory=dict)
    sink_logits: list[list[float]] | None = None   # "logit" sinks: the trained s_h per layer and head


@dataclass
class SinksLab:
    config: SinksLabConfig
    kinds: list[KindResult]
    date: str
    seconds: float
    stopped: bool = False
    threads: int = 0

    def kind(self, name: str) -> KindResult | None:
        return next((k for k in self.kinds if k.kind == name), None)


LETTERS = "abcdefghijklmnopqrstuvwxyz"
TRIGGERS = "qxz"
TRIGGER_IDS = {INDEX[c] for c in TRIGGERS}
LETTER_IDS = [INDEX[c] for c in LETTERS]


def sequence(rng: random.Random, length: int) -> list[int]:
    """<bos>, a letter that is no trigger, then letters drawn uniformly at random, except that after a trigger the
    next letter is the one before the trigger."""
    ids = [BOS, INDEX[rng.choice([c for c in LETTERS if c not in TRIGGERS])]]
    while len(ids) < length:
        ids.append(ids[-2] if ids[-1] in TRIGGER_IDS else rng.choice(LETTER_IDS))
    return ids


def held_out(config: SinksLabConfig) -> list[torch.Tensor]:
    """The test sequences: a random stream of their own, never trained on (the training stream is seeded apart)."""
    rng = random.Random(f"sinks-held-{config.seed}")
    return [torch.tensor(sequence(rng, config.context)) for _ in range(config.test_texts)]


def train_kind(config: SinksLabConfig, kind: str, stop: Callable[[], bool] | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> tuple[torch.nn.Module, float, int]:
    """(the trained model, its mean training loss over the last 50 steps, steps run)."""
    lab = config.lab(kind)
    lab.check()
    model = lab_engine.build_model(lab)
    rng = random.Random(f"sinks-{config.seed}")   # the same batches for both kinds
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n and not n.endswith(".sinks")]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n and not n.endswith(".sinks"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=lab.lr, betas=(0.9, 0.98), eps=1e-9)
    losses, step = [], 0
    model.train()
    for step in range(config.steps):
        if stop is not None and stop():
            break
        batch = torch.tensor([sequence(rng, config.context) for _ in range(config.batch)])   # [B, context]
        for group in optimizer.param_groups:
            group["lr"] = lab_engine.learning_rate(step, lab)
        logits = model(batch).logits[:, :-1]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if progress is not None:
            progress(kind, step + 1, config.steps)
    else:
        step = config.steps
    model.eval()
    return model, sum(losses[-50:]) / max(1, len(losses[-50:])), step


def measure(model, config: SinksLabConfig, kind: str, held: list[torch.Tensor]) -> dict:
    scores = sink_scores(model, held)
    reads = {"full": (config.context, 0), "window": (config.window, 0), "window + <bos>": (config.window, 1)}
    perplexity, past = {}, {}
    for read, (window, sinks) in reads.items():
        losses = torch.stack([streaming_perplexity(model, ids, window, sinks, positions="text").loss for ids in held])
        perplexity[read] = math.exp(float(losses.double().mean()))
        past[read] = math.exp(float(losses[:, config.window - 1:].double().mean()))   # loss[t−1]: query t−1 ≥ window−1
    rounded = lambda t: [[round(float(x), 4) for x in row] for row in t]   # noqa: E731
    sinks = [block.attn.sinks for block in model.stack.blocks] if kind == "sink" and config.sink == "logit" else None
    return dict(first=rounded(scores.first.mean), first_low=rounded(scores.first.low),
                first_high=rounded(scores.first.high), share=round(float(scores.share.mean), 4),
                learned=None if scores.learned is None else rounded(scores.learned.mean),
                perplexity={k: round(v, 3) for k, v in perplexity.items()},
                past_window={k: round(v, 3) for k, v in past.items()},
                sink_logits=None if sinks is None else rounded(torch.stack(sinks).detach()))


def sinks_lab(config: SinksLabConfig, stop: Callable[[], bool] | None = None,
              progress: Callable[[str, int, int], None] | None = None) -> Iterator[KindResult]:
    """Train and measure each kind in turn; yields each as it is done. A stop ends the run before the next step
    (the kind in training is then not measured)."""
    config.check()
    held = held_out(config)
    for kind in KINDS:
        started = time.perf_counter()
        model, loss, steps = train_kind(config, kind, stop, progress)
        if steps < config.steps:
            return
        with torch.inference_mode():
            measured = measure(model, config, kind, held)
        yield KindResult(kind, steps, round(time.perf_counter() - started, 1), round(loss, 4), **measured)


def run_all(config: SinksLabConfig, stop=None, progress=None) -> SinksLab:
    started = time.perf_counter()
    kinds = list(sinks_lab(config, stop, progress))
    return SinksLab(config, kinds, datetime.date.today().isoformat(), round(time.perf_counter() - started, 1),
                    stopped=len(kinds) < len(KINDS), threads=torch.get_num_threads())


def save(result: SinksLab, folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps(dict(
        config=asdict(result.config), kinds=[asdict(k) for k in result.kinds], date=result.date,
        seconds=result.seconds, stopped=result.stopped, threads=result.threads), indent=1))
    return folder


def load(folder: str | Path) -> SinksLab:
    raw = json.loads((Path(folder) / "result.json").read_text(encoding="utf-8"))
    return SinksLab(SinksLabConfig(**raw["config"]), [KindResult(**k) for k in raw["kinds"]], raw["date"],
                    raw["seconds"], raw.get("stopped", False), raw.get("threads", 0))


def table(result: SinksLab) -> str:
    """The result as plain text: the loss, Sink^ε, the largest head's weight on <bos> and the learned sink's,
    and the perplexities."""
    lines = [f"{'kind':<9}{'loss':>7}{'Sink^ε':>8}{'max <bos>':>11}{'max sink':>10}"
             + "".join(f"{read:>16}" for read in READS) + "".join(f"{'past: ' + read:>22}" for read in READS)]
    for k in result.kinds:
        top = max(max(row) for row in k.first)
        learned = f"{max(max(row) for row in k.learned):>10.3f}" if k.learned else f"{'—':>10}"
        lines.append(f"{k.kind:<9}{k.train_loss:>7.3f}{k.share:>8.2f}{top:>11.3f}{learned}"
                     + "".join(f"{k.perplexity[r]:>16.2f}" for r in READS)
                     + "".join(f"{k.past_window[r]:>22.2f}" for r in READS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.lab.sinks", description=__doc__.split("\n\n")[0])
    defaults = SinksLabConfig()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--window", type=int, default=defaults.window)
    lab_engine.threads_argument(parser)
    parser.add_argument("--out", help="save the result (result.json) to this folder")
    args = parser.parse_args(argv)
    error = lab_engine.set_threads(args.threads)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config = SinksLabConfig(steps=args.steps, seed=args.seed, window=args.window)
    try:
        config.check()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    done = lambda kind, step, steps: step % 200 == 0 and print(f"{kind}: step {step} of {steps}", flush=True)  # noqa: E731
    result = run_all(config, progress=done)
    print(f"{result.date}, {result.seconds:.0f} s, threads: {torch.get_num_threads()}; ε = {EPSILON}; "
          f"window {config.window} keys; held-out texts: {config.test_texts} of {config.context} tokens\n")
    print(table(result))
    if args.out:
        print(f"saved to {save(result, args.out)}")
    return 0
