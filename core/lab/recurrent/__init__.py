"""Recurrence beside attention: a small GRU and the Lab's small attention decoder, with matched parameter counts,
trained on the same copy task with the same batches, then measured where the theory says they differ.

    python -m core.lab.recurrent [--steps 2500] [--seed 0] [--threads 1] [--out assets/recurrence]

Both read <bos> source <sep> source <eos> (core.lab.train's decoder-only layout, 1 to 20 letters and digits) and
predict each next token, the loss on the copy only. The GRU (one layer, eq. of a gated recurrent unit:
h_t = (1 − z_t)·h_{t−1} + z_t·h̃_t) must carry every symbol in its state h across the whole source; the decoder's
attention (eq. 2.1) reads the source's symbol directly, whatever the distance. Measured on held-out texts:

  accuracy by distance   the share of copied symbols predicted right (teacher-forced), by the distance between a
                         symbol and its copy (source length + 1)
  gradient by distance   ‖∂ loss / ∂ x_t‖, x_t the input embedding at position t and the loss that of the last
                         copied symbol, by how far back t lies: what reaches an early token from the end
  sequential steps       the steps that must run one after another to read a text of n tokens: n for the GRU
                         (step t needs h_{t−1}), one per layer for attention (every position at once)
  time per step          one training step (forward, backward, update), the two models alternating step by step

The two train one after the other within each step, on the same batch, so that their times share the machine's
load. Float sums depend on the thread count, so a run repeats exactly only at the same count: it is recorded.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import train as lab_engine
from ..train import Batch, LabConfig

TASK = "copy-62"


@dataclass
class RecurrenceConfig:
    steps: int = 2500
    seed: int = 0
    lengths: tuple[int, int] = (1, 20)   # symbols per training text; the held-out texts cover every length
    test_examples: int = 20              # held-out texts per length
    n_layers: int = 3                    # the attention decoder: core/lab/extrapolation.py's, which copies by induction
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 128
    gru_embed: int = 64                  # the GRU's embedding size; its hidden size is chosen to match the count
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 100

    def check(self) -> None:
        lo, hi = self.lengths
        if not 1 <= lo <= hi <= 20:
            raise ValueError(f"lengths must be 1 ≤ shortest ≤ longest ≤ 20 symbols, got {self.lengths}")
        for name, value, low in (("steps", self.steps, 1), ("test_examples", self.test_examples, 1),
                                 ("gru_embed", self.gru_embed, 1), ("batch", self.batch, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be a whole number ≥ {low}, got {value!r}")
        self.lab().check()

    def lab(self) -> LabConfig:
        """The attention decoder's config in core.lab.train's terms (decoder only: Pre-LN, RMSNorm, RoPE, SwiGLU)."""
        return LabConfig(task=TASK, family="llama", n_layers=self.n_layers, d_model=self.d_model,
                         n_heads=self.n_heads, d_ff=self.d_ff, steps=self.steps, batch=self.batch, lr=self.lr,
                         warmup=self.warmup, seed=self.seed, lengths=self.lengths)


# ---- the recurrent model ----

class GRUModel(nn.Module):
    """Embedding → one GRU layer → a linear read-out to the vocabulary, left to right. ids [B, T] → logits [B, T, V]."""

    def __init__(self, vocab: int, d_embed: int, d_hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_embed)
        self.gru = nn.GRU(d_embed, d_hidden, batch_first=True)
        self.head = nn.Linear(d_hidden, vocab)

    def forward(self, ids: Tensor, embeddings: Tensor | None = None) -> Tensor:
        x = self.embed(ids) if embeddings is None else embeddings      # [B, T, d_embed]
        states, _ = self.gru(x)                                         # [B, T, d_hidden]: h_t for every t
        return self.head(states)


def gru_parameters(vocab: int, d_embed: int, d_hidden: int) -> int:
    """The GRU model's parameter count: the embedding, three gates' input and hidden weights and both biases, the
    read-out."""
    return vocab * d_embed + 3 * (d_hidden * d_embed + d_hidden * d_hidden + 2 * d_hidden) + d_hidden * vocab + vocab


def matched_hidden(target: int, vocab: int, d_embed: int) -> int:
    """The hidden size whose GRU model has the parameter count nearest `target`."""
    # 3h² + (3·d_embed + 6 + vocab)·h + vocab·(d_embed + 1) = target, then the nearer whole number
    a, b, c = 3, 3 * d_embed + 6 + vocab, vocab * (d_embed + 1) - target
    root = max(1, int((-b + math.sqrt(max(b * b - 4 * a * c, 0))) / (2 * a)))
    return min((root, root + 1), key=lambda h: abs(gru_parameters(vocab, d_embed, h) - target))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())   # a tied table counts once


def build_models(config: RecurrenceConfig) -> tuple[nn.Module, GRUModel]:
    """(the attention decoder, the GRU with the nearest parameter count), both seeded."""
    attention = lab_engine.build_model(config.lab())
    vocab = len(lab_engine.VOCAB)
    hidden = matched_hidden(parameter_count(attention), vocab, config.gru_embed)
    torch.manual_seed(config.seed)
    return attention, GRUModel(vocab, config.gru_embed, hidden)


# ---- losses and measurements on one batch ----

def logits_of(model: nn.Module, ids: Tensor, mask: Tensor | None = None, embeddings: Tensor | None = None) -> Tensor:
    """[B, T, V] for either model; `embeddings` [B, T, d] replaces the token embeddings (for their gradient)."""
    if isinstance(model, GRUModel):
        return model(ids, embeddings)
    return model(input_ids=ids, attention_mask=mask, token_embeddings=embeddings).logits


def token_embeddings(model: nn.Module, ids: Tensor) -> Tensor:
    """The looked-up rows x_t [B, T, d] of each token (the Transformer scales them and adds nothing else: RoPE turns
    q and k inside attention)."""
    return model.embed(ids) if isinstance(model, GRUModel) else model.stack.embed.tokens(ids)


def batch_loss(model: nn.Module, batch: Batch) -> Tensor:
    logits = logits_of(model, batch.inputs["input_ids"], batch.inputs["attention_mask"])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten(), ignore_index=-100)


def held_out(config: RecurrenceConfig, symbols: int) -> list[tuple[str, str]]:
    return lab_engine.examples(TASK, config.seed, config.test_examples, True, (symbols, symbols))


def copy_accuracy(model: nn.Module, pairs: list[tuple[str, str]]) -> float:
    """The share of copied symbols predicted right, each from the true text before it (teacher-forced); the
    closing <eos> is not a copy and is left out."""
    batch = lab_engine.make_batch(pairs, seq2seq=False)
    model.eval()
    with torch.no_grad():
        predicted = logits_of(model, batch.inputs["input_ids"], batch.inputs["attention_mask"]).argmax(-1)
    copies = (batch.labels != -100) & (batch.labels != lab_engine.EOS)
    return float((predicted == batch.labels)[copies].float().mean())


def gradient_by_distance(model: nn.Module, pairs: list[tuple[str, str]]) -> list[float]:
    """‖∂ loss / ∂ x_t‖ averaged over texts of one length, for t = the loss's own position back to <bos>: entry d is
    the input d places before the position whose loss is taken, which predicts the last copied symbol."""
    batch = lab_engine.make_batch(pairs, seq2seq=False)
    ids, mask = batch.inputs["input_ids"], batch.inputs["attention_mask"]
    symbols = len(pairs[0][0])
    if any(len(s) != symbols for s, _ in pairs):
        raise ValueError("gradient_by_distance needs texts of one length, so that every position lines up")
    at = 2 * symbols                                  # <bos> s_1..s_L <sep> s_1..s_L: position 2L predicts s_L
    model.eval()
    x = token_embeddings(model, ids).detach().requires_grad_(True)               # [B, T, d]
    logits = logits_of(model, ids, mask, embeddings=x)
    loss = F.cross_entropy(logits[:, at].float(), batch.labels[:, at])
    (grad,) = torch.autograd.grad(loss, x)
    norms = grad[:, :at + 1].norm(dim=-1).mean(0)                                 # [at + 1]: positions 0..at
    return norms.flip(0).tolist()                                                 # distance 0 first


def sequential_steps(model: nn.Module, n_tokens: int) -> int:
    """Steps that must run one after another to read n tokens: the GRU's n (h_t needs h_{t−1}, in each of its
    layers), the Transformer's one per layer (every position's attention at once)."""
    if isinstance(model, GRUModel):
        return n_tokens * model.gru.num_layers
    return len(model.stack.blocks)


# ---- training, side by side ----

@dataclass
class ModelResult:
    name: str
    parameters: int
    accuracy: dict[int, float]          # distance between a symbol and its copy → copy accuracy
    gradient_untrained: list[float]     # ‖∂ loss / ∂ x_t‖ by distance back, before training
    gradient_trained: list[float]       # the same after training
    sequential_steps: int               # for the longest text
    step_ms: list[float]                # every training step's time, in order
    train_loss: list[float] = field(default_factory=list)   # every training step's loss

    @property
    def median_step_ms(self) -> float:
        return statistics.median(self.step_ms[WARM_STEPS:] or self.step_ms)


WARM_STEPS = 10   # the first steps of a process pay for set-up: left out of the median step time


@dataclass
class Recurrence:
    config: RecurrenceConfig
    models: list[ModelResult]           # the attention decoder, then the GRU
    longest_tokens: int                 # tokens in a text of the longest length, <bos> … <eos>
    gru_hidden: int
    date: str
    seconds: float
    threads: int


def run(config: RecurrenceConfig, stop=None) -> Recurrence:
    """Train both models on the same batches, alternating step by step, and measure them."""
    config.check()
    started = time.perf_counter()
    attention, gru = build_models(config)
    models = {"attention": attention, "GRU": gru}
    longest = held_out(config, config.lengths[1])
    untrained = {name: gradient_by_distance(m, longest) for name, m in models.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=config.lr, betas=(0.9, 0.98), eps=1e-9,
                                          weight_decay=0.0) for name, m in models.items()}
    times = {name: [] for name in models}
    losses = {name: [] for name in models}
    rng, lab = random.Random(f"{TASK}-{config.seed}-train"), config.lab()
    for step in range(config.steps):
        if stop is not None and stop():
            break
        pairs = []
        while len(pairs) < config.batch:
            source, target = lab_engine.TASKS[TASK](rng, *config.lengths)
            if not lab_engine.held_out(source):
                pairs.append((source, target))
        batch = lab_engine.make_batch(pairs, seq2seq=False)
        for name, model in models.items():
            times[name].append(1e3 * train_step(model, optimizers[name], batch, lab_engine.learning_rate(step, lab),
                                                losses[name]))
    lo, hi = config.lengths
    results = []
    for name, model in models.items():
        accuracy = {symbols + 1: copy_accuracy(model, held_out(config, symbols)) for symbols in range(lo, hi + 1)}
        results.append(ModelResult(name, parameter_count(model), accuracy, untrained[name],
                                   gradient_by_distance(model, longest),
                                   sequential_steps(model, 2 * hi + 3), times[name], losses[name]))
    return Recurrence(config, results, 2 * hi + 3, gru.gru.hidden_size, datetime.date.today().isoformat(),
                      round(time.perf_counter() - started, 1), torch.get_num_threads())


def train_step(model: nn.Module, optimizer, batch: Batch, lr: float, losses: list[float]) -> float:
    """One step (forward, backward, clipped update); its seconds. The loss is appended to `losses`."""
    started = time.perf_counter()
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    loss = batch_loss(model, batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    seconds = time.perf_counter() - started
    losses.append(loss.item())
    return seconds


# ---- saving and loading ----

def save(result: Recurrence, folder: str | Path, command: str = "") -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    models = [{**asdict(m), "accuracy": {str(k): v for k, v in m.accuracy.items()}} for m in result.models]
    path = folder / "result.json"
    path.write_text(json.dumps(dict(config=asdict(result.config), models=models, longest_tokens=result.longest_tokens,
                                    gru_hidden=result.gru_hidden, date=result.date, seconds=result.seconds,
                                    threads=result.threads, command=command), indent=1) + "\n", encoding="utf-8")
    return path


def load(folder: str | Path) -> Recurrence:
    """A saved result; KeyError, ValueError or TypeError where the file is not one."""
    raw = json.loads((Path(folder) / "result.json").read_text(encoding="utf-8"))
    given = raw["config"]
    config = RecurrenceConfig(**{**given, "lengths": tuple(given["lengths"])})
    models = [ModelResult(m["name"], int(m["parameters"]), {int(k): float(v) for k, v in m["accuracy"].items()},
                          [float(g) for g in m["gradient_untrained"]], [float(g) for g in m["gradient_trained"]],
                          int(m["sequential_steps"]), [float(t) for t in m["step_ms"]],
                          [float(x) for x in m.get("train_loss", [])]) for m in raw["models"]]
    return Recurrence(config, models, int(raw["longest_tokens"]), int(raw["gru_hidden"]), str(raw["date"]),
                      float(raw["seconds"]), int(raw["threads"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.lab.recurrent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=RecurrenceConfig.steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch's thread count (a run repeats at the same one)")
    parser.add_argument("--out", help="save result.json to this folder")
    args = parser.parse_args(argv)
    config = RecurrenceConfig(steps=args.steps, seed=args.seed)
    if args.threads < 1:
        print("error: --threads must be at least 1", file=sys.stderr)
        return 2
    try:
        config.check()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    result = run(config)
    for m in result.models:
        far, near = max(m.accuracy), min(m.accuracy)
        print(f"{m.name:>9}: {m.parameters:,} parameters, copy accuracy {m.accuracy[near]:.0%} at distance {near}, "
              f"{m.accuracy[far]:.0%} at {far}; gradient at distance {len(m.gradient_trained) - 1} / at 0: "
              f"{m.gradient_trained[-1] / m.gradient_trained[0]:.2e} (untrained "
              f"{m.gradient_untrained[-1] / m.gradient_untrained[0]:.2e}); {m.sequential_steps} sequential steps "
              f"for {result.longest_tokens} tokens; {m.median_step_ms:.1f} ms a training step")
    print(f"{result.date}, {result.seconds:.0f} s, {result.threads} thread(s)")
    if args.out:
        command = "python -m core.lab.recurrent " + " ".join(argv if argv is not None else sys.argv[1:])
        print(f"saved {save(result, args.out, command.strip())}")
    return 0
