"""Positions past the trained length: one small decoder trained with each kind of position on the same copy task,
then tested on texts longer than any it saw.

    python -m core.lab.extrapolation [--steps 2500] [--seed 0] [--kinds sinusoidal,learned,...] [--threads N]
                                 [--out assets/extrapolation]

Every kind gets the same model (core.lab.train's decoder-only Llama layout: Pre-LN, RMSNorm, SwiGLU), the same seed,
the same batches and the same number of steps; only the positions differ (docs/theory.md eqs. 4.1, 6.2–6.4):
sinusoids or a learned table added to the embeddings, rotary angles on q and k, ALiBi's −m_h·(i − j) or T5's
learned bucket bias on the scores, or nothing at all. The task copies 1 to 12 symbols (<bos> source <sep> target
<eos>, 62 letters and digits); tests copy 12, 24 and 48.

The learned table has exactly as many rows as the longest training sequence (2·12 + 3 = 27), so a longer test
has no row to read: its result is a refusal naming the first missing position, never a number read from rows
that were never trained.

Float sums in a pass depend on how many threads share them, and 2,500 steps carry those last bits into different
weights, so a run repeats exactly only at the same thread count: the result records it, and --threads sets it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from . import train as lab_engine
from .train import LabConfig, Run

KINDS = lab_engine.POSITION_KINDS  # sinusoidal, learned, rope, alibi, relative, none
TASK = "copy-62"


def sequence_length(symbols: int) -> int:
    return 2 * symbols + 3  # <bos> source <sep> target <eos>


@dataclass
class ExtrapolationConfig:
    kinds: tuple[str, ...] = KINDS
    steps: int = 2500               # the slowest kind here (T5's buckets) copies the trained length by then
    seed: int = 0
    train_longest: int = 12         # training texts copy 1 … train_longest symbols
    test_lengths: tuple[int, ...] = (12, 24, 48)
    test_examples: int = 100        # held-out texts per test length
    n_layers: int = 3               # two layers are the fewest that copy by induction; a third learns it in budget
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 128
    batch: int = 32
    lr: float = 1e-3                # 3e-3 leaves the rotary model unconverged in this budget

    def check(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds or len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds must be distinct names among {', '.join(KINDS)}, got {list(self.kinds)}")
        if not 1 <= self.train_longest <= 20:
            raise ValueError(f"train_longest must be between 1 and 20 symbols, got {self.train_longest}")
        if not self.test_lengths or any(not 1 <= n <= 200 for n in self.test_lengths):
            raise ValueError(f"test lengths must be between 1 and 200 symbols, got {list(self.test_lengths)}")
        if not 1 <= self.test_examples <= 1000:
            raise ValueError(f"test_examples must be between 1 and 1000, got {self.test_examples}")
        self.lab("rope").check()  # the model's and the training's own limits, with their messages

    def lab(self, kind: str) -> LabConfig:
        """The lab config of one kind: everything shared but the positions, and the learned table's rows."""
        rows = sequence_length(self.train_longest if kind == "learned" else max(self.test_lengths))
        return LabConfig(task=TASK, family="llama", positions=kind, n_layers=self.n_layers, d_model=self.d_model,
                         n_heads=self.n_heads, d_ff=self.d_ff, steps=self.steps, batch=self.batch, lr=self.lr,
                         warmup=min(100, self.steps // 10), seed=self.seed, lengths=(1, self.train_longest),
                         eval_every=self.steps, eval_examples=self.test_examples, max_len=rows)


@dataclass
class KindResult:
    """One kind of position, trained and tested. Per test length (symbols): accuracy, the share of target tokens
    (symbols and <eos>) predicted right after the right prefix; exact, the share of texts with every token right,
    which is the share greedy decoding copies exactly; copy_weight, the chosen head's mean weight on the symbol to
    copy; or, in refused, why there is no number."""
    kind: str
    steps: int
    seconds: float
    train_loss: float
    accuracy: dict[int, float] = field(default_factory=dict)
    exact: dict[int, float] = field(default_factory=dict)
    copy_weight: dict[int, float] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    head: tuple[int, int] = (0, 0)  # (layer, head) with the most weight on the symbol to copy at train_longest
    by_index: list[float] = field(default_factory=list)  # accuracy at each target place, longest tested length
    attention: np.ndarray | None = None  # [T, T] the head on the first text of the longest length it can read
    attention_symbols: int = 0  # that length
    tokens: list[str] = field(default_factory=list)  # that text's tokens


@dataclass
class Extrapolation:
    config: ExtrapolationConfig
    kinds: list[KindResult]
    date: str
    seconds: float
    stopped: bool = False  # asked to stop: kinds holds those that finished
    threads: int = 0       # torch's intra-op threads during the run

    def kind(self, name: str) -> KindResult | None:
        return next((k for k in self.kinds if k.kind == name), None)


def missing_position(lab: LabConfig, symbols: int) -> str | None:
    """Why a learned table cannot read a text of `symbols` symbols, or None."""
    needed = sequence_length(symbols)
    if lab.positions != "learned" or needed <= lab.max_len:
        return None
    return (f"no position {lab.max_len + 1} in the table: it has {lab.max_len} rows, one per position of the longest "
            f"training sequence, and copying {symbols} symbols takes {needed} positions")


def copy_places(symbols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query rows that predict a copied symbol (<sep> and the target's first n − 1) and the key holding it."""
    k = torch.arange(symbols)
    return symbols + 1 + k, 1 + k


def scored(model, pairs: list[tuple[str, str]], approx=None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One teacher-forced pass over copies of one length: right [B, T] (the target token predicted right after the
    right prefix), wanted [B, T] (the places that predict a target token: its symbols and <eos>) and every
    layer's attention [B, H, T, T]. A text with every wanted place right is one greedy decoding copies exactly:
    each greedy step then sees the right prefix and picks the right token. approx: the run's approximation of
    attention (core.lab.train.lab_approx), or None."""
    batch = lab_engine.make_batch(pairs, seq2seq=False)
    with torch.inference_mode():
        out = model(**batch.inputs, capture_attention=True, approx=approx)
    wanted = batch.labels != -100
    return (out.logits.argmax(-1) == batch.labels) & wanted, wanted, list(out.attentions)


def measure(run: Run, config: ExtrapolationConfig) -> KindResult:
    """Test a trained model at every length of the config; the copy head is chosen at train_longest."""
    model, lab = run.model, run.lab
    model.eval()
    last = run.history[-1]
    result = KindResult(lab.positions, last.step, round(last.seconds, 1), last.train_loss)
    weights: dict[int, torch.Tensor] = {}  # length → [L, H] mean weight on the symbol to copy
    first_maps: dict[int, tuple[str, list[torch.Tensor]]] = {}  # length → the first text, each layer's [H, T, T]
    for symbols in sorted(set(config.test_lengths) | {config.train_longest}):
        reason = missing_position(lab, symbols)
        if reason:
            result.refused[symbols] = reason
            continue
        pairs = lab_engine.examples(TASK, config.seed, config.test_examples, True, (symbols, symbols))
        right, wanted, attentions = scored(model, pairs)
        if symbols in config.test_lengths:
            result.accuracy[symbols] = right.sum().item() / wanted.sum().item()
            result.exact[symbols] = (right | ~wanted).all(1).float().mean().item()
        queries, keys = copy_places(symbols)
        weights[symbols] = torch.stack([p[:, :, queries, keys].mean((0, 2)) for p in attentions])   # [L, H]
        first_maps[symbols] = pairs[0][0], [p[0] for p in attentions]
        by_place = right.sum(0)[wanted[0]] / len(pairs)                    # [symbols + 1]
        if symbols == max(config.test_lengths):
            result.by_index = [round(x, 4) for x in by_place.tolist()]
    layer, head = divmod(int(weights[config.train_longest].argmax()), lab.n_heads)
    result.head = (layer, head)
    result.copy_weight = {n: w[layer, head].item() for n, w in weights.items() if n in config.test_lengths}
    longest = max((n for n in config.test_lengths if n in first_maps), default=None)
    if longest is not None:
        source, maps = first_maps[longest]
        result.attention = maps[layer][head].numpy().astype(np.float32)
        result.attention_symbols = longest
        result.tokens = ["<bos>", *source, "<sep>", *source, "<eos>"]
    return result


def extrapolation(config: ExtrapolationConfig, stop: Callable[[], bool] | None = None,
                  progress: Callable[[str, int, int], None] | None = None) -> Iterator[KindResult]:
    """Train and test each kind in turn, yielding its result when it is done. progress(kind, step, steps) after
    every step; stop() is asked before every step, and a kind stopped half-way yields nothing."""
    config.check()
    for kind in config.kinds:
        run = None
        for run, p in lab_engine.train(config.lab(kind), stop=stop):
            if progress is not None:
                progress(kind, p.step, config.steps)
        if run is None or run.stopped:
            return
        yield measure(run, config)


def run_all(config: ExtrapolationConfig, stop=None, progress=None) -> Extrapolation:
    started = time.perf_counter()
    kinds = list(extrapolation(config, stop, progress))
    return Extrapolation(config, kinds, datetime.date.today().isoformat(), round(time.perf_counter() - started, 1),
                         stopped=len(kinds) < len(config.kinds), threads=torch.get_num_threads())


# ---- saving: numbers as JSON, the attention maps as one .npz (read with allow_pickle=False) ----

def save(result: Extrapolation, folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kinds = []
    for k in result.kinds:
        row = {name: value for name, value in asdict(k).items() if name != "attention"}
        kinds.append(row)
    config = asdict(result.config)
    (folder / "result.json").write_text(json.dumps(dict(config=config, kinds=kinds, date=result.date,
                                                        seconds=result.seconds, stopped=result.stopped,
                                                        threads=result.threads), indent=1))
    np.savez_compressed(folder / "attention.npz", **{k.kind: k.attention.astype(np.float16)
                                                    for k in result.kinds if k.attention is not None})
    return folder


def load(folder: str | Path) -> Extrapolation:
    folder = Path(folder)
    raw = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    config = ExtrapolationConfig(**{name: tuple(v) if isinstance(v, list) else v for name, v in raw["config"].items()})
    with np.load(folder / "attention.npz", allow_pickle=False) as maps:
        stored = {name: maps[name].astype(np.float32) for name in maps.files}
    kinds = []
    for row in raw["kinds"]:
        by_length = {name: {int(n): v for n, v in row[name].items()}
                     for name in ("accuracy", "exact", "copy_weight", "refused")}
        kinds.append(KindResult(**{**row, **by_length, "head": tuple(row["head"])}, attention=stored.get(row["kind"])))
    return Extrapolation(config, kinds, raw["date"], raw["seconds"], raw.get("stopped", False), raw.get("threads", 0))


def table(result: Extrapolation) -> str:
    """The result as a plain-text table: accuracy and exact copies per length, and the copy head's weight."""
    lengths = result.config.test_lengths
    head = f"{'kind':<11}{'loss':>7}" + "".join(f"{f'acc@{n}':>9}" for n in lengths) + \
        "".join(f"{f'exact@{n}':>10}" for n in lengths) + "   head   " + "".join(f"{f'w@{n}':>7}" for n in lengths)
    lines = [head]
    for k in result.kinds:
        cell = lambda d, n, w: f"{d[n]:>{w}.2f}" if n in d else f"{'—':>{w}}"  # noqa: E731
        lines.append(f"{k.kind:<11}{k.train_loss:>7.3f}" + "".join(cell(k.accuracy, n, 9) for n in lengths) +
                     "".join(cell(k.exact, n, 10) for n in lengths) + f"   L{k.head[0]} H{k.head[1]}  " +
                     "".join(cell(k.copy_weight, n, 7) for n in lengths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.lab.extrapolation", description=__doc__.split("\n\n")[0])
    defaults = ExtrapolationConfig()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--kinds", default=",".join(defaults.kinds), help=f"comma-separated among {', '.join(KINDS)}")
    parser.add_argument("--test-examples", type=int, default=defaults.test_examples)
    lab_engine.threads_argument(parser)
    parser.add_argument("--out", help="save the result (result.json, attention.npz) to this folder")
    args = parser.parse_args(argv)
    error = lab_engine.set_threads(args.threads)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config = ExtrapolationConfig(kinds=tuple(args.kinds.split(",")), steps=args.steps, seed=args.seed,
                                 test_examples=args.test_examples)
    try:
        config.check()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    done = lambda kind, step, steps: step == steps and print(f"{kind}: {steps} steps trained", flush=True)  # noqa: E731
    result = run_all(config, progress=done)
    print(f"{result.date}, {result.seconds:.0f} s, threads: {torch.get_num_threads()}; accuracy: target tokens right "
          f"after the right prefix; exact: whole copies; w: the copy head's weight on the symbol to copy\n")
    print(table(result))
    for k in result.kinds:
        for n, reason in k.refused.items():
            print(f"{k.kind} at {n} symbols: {reason}")
    if args.out:
        print(f"saved to {save(result, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
