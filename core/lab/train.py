"""Train a small Transformer from scratch on a toy task: the training lab's engine, and its command line.

    python -m core.lab.train --task reverse --family marian --steps 600 --seed 0 [--no-causal-mask]
                         [--no-positions] [--no-scale] [--norm post|pre] [--no-embed-scale] [--attention-only]
                         [--attention softmax|performer|gated|differential] [--features 64]
                         [--lengths 8 12] [--out weights/NAME]

Tasks are generated on the fly from a seed, character by character, with a held-out split (a fixed tenth of
all sources, by hash). Each is a sequence-to-sequence task (the Marian layout: the original Transformer's
encoder, decoder and cross-attention) or a decoder-only one (Llama layout: <bos> source <sep> target <eos>,
loss on the target). Models are the core's own Transformer; the switches change exactly one thing each.
"""
from __future__ import annotations

import argparse
import calendar
import json
import math
import random
import re
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from ..approx import Approx
from ..attention import row_entropy
from ..config import ModelConfig
from ..model import Transformer

# ---- the vocabulary: characters, and four special tokens ----
PAD, BOS, EOS, SEP = 0, 1, 2, 3
SPECIALS = ["<pad>", "<bos>", "<eos>", "<sep>"]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ -+=")
VOCAB = SPECIALS + CHARS
INDEX = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    return [INDEX[c] for c in text]


def decode(ids) -> str:
    """Characters up to the first <eos>; other special tokens are dropped."""
    out = []
    for i in ids:
        if i == EOS:
            break
        if i >= len(SPECIALS):
            out.append(VOCAB[i])
    return "".join(out)


# ---- tasks ----

def letters(rng: random.Random, n: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz") -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


SYMBOLS = CHARS[:62]  # digits and both cases: repeats in a long text are rarer than with 26 letters


def date_example(rng: random.Random) -> tuple[str, str]:
    year, month = rng.randint(1900, 2099), rng.randint(1, 12)
    day = rng.randint(1, calendar.monthrange(year, month)[1])
    return f"{year}-{month:02d}-{day:02d}", f"{day} {calendar.month_name[month]} {year}"


TASKS: dict[str, Callable[[random.Random, int, int], tuple[str, str]]] = {
    "copy": lambda rng, lo, hi: (s := letters(rng, rng.randint(lo, hi)), s),
    "copy-62": lambda rng, lo, hi: (s := letters(rng, rng.randint(lo, hi), "".join(SYMBOLS)), s),
    "reverse": lambda rng, lo, hi: (s := letters(rng, rng.randint(lo, hi)), s[::-1]),
    "sort": lambda rng, lo, hi: (s := "".join(rng.choice("0123456789") for _ in range(rng.randint(lo, hi))),
                                 "".join(sorted(s))),
    "add": lambda rng, lo, hi: (f"{(a := rng.randint(0, 10 ** rng.randint(1, 4)))}+{(b := rng.randint(0, 10 ** rng.randint(1, 4)))}",
                                str(a + b)),
    "dates": lambda rng, lo, hi: date_example(rng),
}


def held_out(source: str) -> bool:
    """A fixed tenth of all sources, whatever the seed: never trained on, used for evaluation."""
    return zlib.crc32(source.encode()) % 10 == 0


def examples(task: str, seed: int, n: int, held: bool, lengths: tuple[int, int]) -> list[tuple[str, str]]:
    """n (source, target) pairs from the training part (held=False) or the held-out part of the task."""
    make, rng, out = TASKS[task], random.Random(f"{task}-{seed}-{held}"), []
    for _ in range(200 * n):
        source, target = make(rng, *lengths)
        if held_out(source) == held:
            out.append((source, target))
            if len(out) == n:
                return out
    raise ValueError(f"task {task!r} has too few {'held-out' if held else 'training'} examples for {n}")


# ---- models ----

POSITION_KINDS = ("sinusoidal", "learned", "rope", "alibi", "relative", "none")
SCORE_BIASES = {"alibi": "alibi", "relative": "relative"}  # kinds said by a term on the scores, not the vectors
# the attention a Lab model trains with: exact softmax; Performer's FAVOR+ in its place (core.approx, on every
# self-attention layer, in training and evaluation); or one of the two named terms of the one attention function
# (core.config: attn_output_gate, differential_attention)
ATTENTIONS = ("softmax", "performer", "gated", "differential")

@dataclass
class LabConfig:
    task: str = "reverse"
    family: str = "marian"          # "marian": encoder-decoder (Post-LN, sinusoids); "llama": decoder only (Pre-LN, RoPE)
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.0
    positions: str | None = None    # None: the family's own; "sinusoidal" | "learned" | "rope" | "alibi" |
                                    # "relative" (T5's buckets; both decoder only) | "none"
    norm: str | None = None         # None: the family's own; "pre" | "post"
    causal_mask: bool = True        # in the decoder, while training
    scale: bool = True              # 1/√d_k
    embed_scale: bool = True        # the Marian layout's √d times the token embeddings (tied to the output)
    steps: int = 600
    batch: int = 64
    lr: float = 1e-3
    warmup: int = 100
    seed: int = 0
    lengths: tuple[int, int] = (8, 12)
    eval_every: int = 100
    eval_examples: int = 200
    time_budget: float | None = None  # seconds; the run stops after it
    snapshot_steps: tuple[int, ...] = ()  # after these steps, keep the attention on the first held-out example
    max_len: int = 64               # positions the model has: the learned table's rows; longest sequence any task
                                    # makes here, with its special tokens, by default
    sinks: str = ""                 # "logit" | "key": a learned sink in each softmax's denominator (core.lab.sinks)
    attention_only: bool = False    # decoder only: every block adds its attention and nothing else (its MLP's output
                                    # weights are zero and never trained), as Olsson et al. (2022) train
    attention: str = "softmax"      # one of ATTENTIONS: "softmax"; "performer" (FAVOR+, decoder only); "gated" (a
                                    # sigmoid gate on each head's output, Qiu et al. 2025); "differential" (two
                                    # softmaxes subtracted, Ye et al. 2025)
    performer_features: int = 64    # performer: random features per head
    performer_seed: int | None = None  # performer: the features' seed, fixed for the whole run; None: the run's seed

    def check(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; tasks: {', '.join(TASKS)}")
        if self.family not in ("marian", "llama"):
            raise ValueError(f"family must be 'marian' (encoder-decoder) or 'llama' (decoder only), got {self.family!r}")
        for name, value, lo, hi in (("n_layers", self.n_layers, 1, 4), ("d_model", self.d_model, 16, 512),
                                    ("n_heads", self.n_heads, 1, 16), ("d_ff", self.d_ff, 1, 4096),
                                    ("steps", self.steps, 1, 100_000), ("batch", self.batch, 1, 1024)):
            if not lo <= value <= hi:
                raise ValueError(f"{name} must be between {lo} and {hi}, got {value}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if self.sinks not in ("", "logit", "key"):
            raise ValueError(f"sinks must be 'logit', 'key' or empty, got {self.sinks!r}")
        if self.attention_only and self.family != "llama":
            raise ValueError("an attention-only model is a decoder here: family 'llama' only")
        if self.sinks and self.family != "llama":
            raise ValueError("learned sinks are a decoder's term here: family 'llama' only")
        if self.positions not in (None, *POSITION_KINDS):
            raise ValueError(f"positions must be one of {', '.join(POSITION_KINDS)}, got {self.positions!r}")
        if self.positions in SCORE_BIASES and self.family != "llama":
            raise ValueError(f"{self.positions} positions are a bias on a decoder's scores here: family 'llama' only")
        if self.positions == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError("rotary positions need an even head size (d_model / n_heads)")
        if self.norm not in (None, "pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {self.norm!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        for name, value, lo in (("eval_every", self.eval_every, 1), ("eval_examples", self.eval_examples, 1),
                                ("warmup", self.warmup, 0)):
            if value < lo:
                raise ValueError(f"{name} must be at least {lo}, got {value}")
        lo, hi = self.lengths
        if not 1 <= lo <= hi <= 20:
            raise ValueError(f"lengths must be 1 ≤ shortest ≤ longest ≤ 20, got {self.lengths}")
        if not 8 <= self.max_len <= 4096:
            raise ValueError(f"max_len must be between 8 and 4096, got {self.max_len}")
        if any(not 0 <= s <= self.steps for s in self.snapshot_steps):
            raise ValueError(f"snapshot steps must lie in 0..{self.steps}, got {list(self.snapshot_steps)}")
        self.check_attention()

    def check_attention(self) -> None:
        """The attention choice and its budget, refused in words where this run cannot carry them."""
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {self.attention!r}")
        features, seed = self.performer_features, self.performer_seed
        if isinstance(features, bool) or not isinstance(features, int) or not 1 <= features <= 1024:
            raise ValueError(f"performer_features must be a whole number from 1 to 1024, got {features!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"performer_seed must be a whole number ≥ 0 (or None: the run's seed), got {seed!r}")
        if self.attention == "performer":
            if self.family != "llama":
                raise ValueError("Performer replaces the self-attention of every layer here, which the Lab does for a "
                                 "decoder: family 'llama' only (in the Marian layout it would reach the encoder only)")
            if self.sinks or self.positions in SCORE_BIASES:
                term = "a learned sink" if self.sinks else f"{self.positions} positions (a bias on the scores)"
                raise ValueError(f"Performer estimates exp(q·k) with random features; it cannot carry {term}")
        if self.attention == "differential" and self.sinks:
            raise ValueError("differential attention subtracts two softmaxes; a learned sink in them has no form here")
        if self.attention in ("gated", "differential"):
            model_config(self)     # the core's own check of the term (core.config.ModelConfig.variant_problem)


# The Lab's default run: what the Lab tab trains when its fields are left as they open (ui/services/lab/configs.py
# reads its fields from here, adding the server's time budget) and what bench/lab_snapshots.py measures. Its
# snapshot steps are where its attention has formed (seeded, so the same curve on every run): the weight layer 1's
# cross-attention gives the mirrored source position stays uniform (0.08) to step 190, as at 50 and 150, then
# rises: 0.33 at 310 as the anti-diagonal appears, 0.51 at 410 mid-rise, 0.66 at the end.
DEFAULT_RUN = LabConfig(task="reverse", family="marian", n_layers=2, d_model=128, n_heads=4, d_ff=256, dropout=0.0,
                        seed=0, steps=600, lr=1e-3, warmup=100, eval_every=60, snapshot_steps=(310, 410, 600))


def model_config(lab: LabConfig) -> ModelConfig:
    """The core's ModelConfig for a lab run."""
    head_dim = lab.d_model // lab.n_heads
    if lab.family == "marian":
        cfg = ModelConfig(
            family="marian", model_type="marian", n_layers=lab.n_layers, n_heads=lab.n_heads, n_kv_heads=lab.n_heads,
            d_model=lab.d_model, head_dim=head_dim, d_ff=lab.d_ff, vocab_size=len(VOCAB), max_positions=lab.max_len,
            positional="sinusoidal", norm="layernorm", norm_placement="post", causal=True, is_encoder_decoder=True,
            activation="relu", final_norm=False, embed_scale=lab.d_model ** 0.5 if lab.embed_scale else 1.0,
            lm_head_bias=True,
            n_encoder_layers=lab.n_layers, encoder_d_ff=lab.d_ff, encoder_n_heads=lab.n_heads, pad_token_id=PAD,
            eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS)
    else:
        cfg = ModelConfig(
            family="llama", model_type="llama", n_layers=lab.n_layers, n_heads=lab.n_heads, n_kv_heads=lab.n_heads,
            d_model=lab.d_model, head_dim=head_dim, d_ff=1 if lab.attention_only else lab.d_ff,
            vocab_size=len(VOCAB), max_positions=lab.max_len,
            positional="rope", norm="rmsnorm", norm_placement="pre", causal=True, is_encoder_decoder=False,
            activation="silu", gated_ffn=True, qkv_bias=False, out_bias=False, ffn_bias=False, norm_bias=False,
            tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
    positional = "none" if lab.positions in SCORE_BIASES else lab.positions or cfg.positional
    return replace(cfg, positional=positional, score_bias=SCORE_BIASES.get(lab.positions, "none"),
                   norm_placement=lab.norm or cfg.norm_placement,
                   final_norm=(lab.norm or cfg.norm_placement) == "pre", scale_attention=lab.scale,
                   dropout=lab.dropout, attention_sinks=lab.sinks, attn_output_gate=lab.attention == "gated",
                   differential_attention=lab.attention == "differential")


def lab_approx(lab: LabConfig) -> Approx | None:
    """The approximation every pass of a run goes through (training, evaluation, its maps): FAVOR+ on every layer
    with fixed features (the same ω at every step: one seed per layer from performer_seed, else the run's seed),
    or None for exact attention."""
    if lab.attention != "performer":
        return None
    seed = lab.seed if lab.performer_seed is None else lab.performer_seed
    return Approx("performer", features=lab.performer_features, seed=seed)


def build_model(lab: LabConfig) -> Transformer:
    """A freshly initialised model: N(0, 0.02) weights (embeddings N(0, d^-½)), zero biases, unit norm gains;
    differential attention's λ vectors N(0, 0.1²), as the paper's (at zero, exp(λ_q·λ_k) would have no gradient).
    attention_only: each MLP keeps its place (the checkpoint stays a standard Llama one, d_ff 1) but its output
    weights are zero and frozen, so it adds exactly 0 to the residual stream."""
    torch.manual_seed(lab.seed)
    model = Transformer(model_config(lab))
    for name, p in model.named_parameters():
        if name.endswith("embed.tokens.weight"):
            torch.nn.init.normal_(p, std=lab.d_model ** -0.5)
        elif p.ndim >= 2:
            torch.nn.init.normal_(p, std=0.02)
        elif "norm" in name and name.endswith("weight"):
            torch.nn.init.ones_(p)
        elif name.rsplit(".", 1)[-1].startswith("lambda_"):
            torch.nn.init.normal_(p, std=0.1)
        else:
            torch.nn.init.zeros_(p)
    if lab.attention_only:
        for block in model.stack.blocks:
            torch.nn.init.zeros_(block.ffn.down.weight)
            block.ffn.requires_grad_(False)
    model.tokenizer = None
    return model


# ---- batches ----

def pad(rows: list[list[int]], left: bool = False) -> tuple[Tensor, Tensor]:
    """Token rows → ids [B, T] padded with <pad>, and the mask [B, T] (1 on real tokens)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span], mask[i, span] = torch.tensor(r), 1
    return ids, mask


@dataclass
class Batch:
    inputs: dict          # keyword arguments of the model's forward pass
    labels: Tensor        # [B, T] target ids, -100 where no loss is taken
    n_tokens: int


def make_batch(pairs: list[tuple[str, str]], seq2seq: bool) -> Batch:
    if seq2seq:  # encoder: source <eos>; decoder: <bos> target, predicting target <eos>
        src, src_mask = pad([encode(s) + [EOS] for s, _ in pairs])
        dec, _ = pad([[BOS] + encode(t) for _, t in pairs])
        labels, label_mask = pad([encode(t) + [EOS] for _, t in pairs])
        labels = labels.masked_fill(label_mask == 0, -100)
        return Batch(dict(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec), labels,
                     int(src_mask.sum() + label_mask.sum()))
    rows = [[BOS] + encode(s) + [SEP] + encode(t) + [EOS] for s, t in pairs]
    ids, mask = pad(rows)
    labels = torch.full_like(ids, -100)  # position i predicts token i + 1, only inside the target
    for i, (s, _) in enumerate(pairs):
        start = len(s) + 1                               # the <sep> position predicts the target's first token
        labels[i, start:len(rows[i]) - 1] = ids[i, start + 1:len(rows[i])]
    return Batch(dict(input_ids=ids, attention_mask=mask), labels, int(mask.sum()))


def loss_of(model: Transformer, batch: Batch, lab: LabConfig) -> Tensor:
    logits = model(**batch.inputs, causal_mask=lab.causal_mask, approx=lab_approx(lab)).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten(), ignore_index=-100)


def greedy(model: Transformer, prompts: Tensor, new_tokens: int, mask: Tensor | None = None,
           approx: Approx | None = None) -> Tensor:
    """Prompts [B, T] (left-padded, mask [B, T]) and `new_tokens` greedy tokens: with the KV cache
    (model.generate), or under `approx` by whole passes without it, since the approximation is a switch of the whole
    pass (decoder only)."""
    if approx is None:
        return model.generate(prompts, new_tokens, attention_mask=mask)
    ids, mask = prompts, torch.ones_like(prompts) if mask is None else mask
    for _ in range(new_tokens):
        logits = model(ids, attention_mask=mask, approx=approx).logits[:, -1]            # [B, vocab]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids


def exact_match(model: Transformer, pairs: list[tuple[str, str]], seq2seq: bool, approx: Approx | None = None) -> float:
    """Free-running greedy generation (with the KV cache; under `approx`, by whole passes): the share of held-out
    targets reproduced exactly."""
    longest = max(len(t) for _, t in pairs) + 1
    if seq2seq:
        src, mask = pad([encode(s) + [EOS] for s, _ in pairs])
        out = model.generate(src, longest, attention_mask=mask)[:, 1:]
    else:
        prompts, mask = pad([[BOS] + encode(s) + [SEP] for s, _ in pairs], left=True)
        out = greedy(model, prompts, longest, mask, approx)[:, prompts.shape[1]:]
    return sum(decode(row.tolist()) == t for row, (_, t) in zip(out, pairs)) / len(pairs)


# ---- training ----

@dataclass
class Progress:
    step: int
    train_loss: float
    held_loss: float | None = None
    exact_match: float | None = None
    tokens_per_s: float = 0.0
    seconds: float = 0.0


@dataclass
class LabAttention:
    """Every layer's and head's attention on one example, float32. Encoder-decoder: encoder [L, H, S, S] over the
    source, decoder [L, H, T, T] over the target so far, cross [L, H, T, S] (each target position over the source).
    Decoder only: decoder [L, H, N, N] over <bos> source <sep> target, encoder and cross None."""
    source_tokens: list[str]
    target_tokens: list[str]
    decoder: Tensor
    encoder: Tensor | None = None
    cross: Tensor | None = None


@dataclass
class Run:
    lab: LabConfig
    model: Transformer
    history: list[Progress] = field(default_factory=list)
    stopped: bool = False
    initial_entropy: list[float] = field(default_factory=list)  # mean attention entropy per layer before training
    snapshots: dict[int, LabAttention] = field(default_factory=dict)

    @property
    def final(self) -> Progress | None:
        evaluated = [p for p in self.history if p.exact_match is not None]
        return evaluated[-1] if evaluated else None


def learning_rate(step: int, lab: LabConfig) -> float:
    """Linear warm-up to lr, then cosine decay to a tenth of it."""
    if step < lab.warmup:
        return lab.lr * (step + 1) / lab.warmup
    done = (step - lab.warmup) / max(1, lab.steps - lab.warmup)
    return lab.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def train(lab: LabConfig, stop: Callable[[], bool] | None = None) -> Iterator[tuple[Run, Progress]]:
    """Train a fresh model; yields (run, progress) after every step, with held-out loss and exact match every
    eval_every steps and at the end. stop() is asked before every step."""
    lab.check()
    seq2seq = lab.family == "marian"
    model = build_model(lab)
    run = Run(lab, model)
    held = examples(lab.task, lab.seed, lab.eval_examples, True, lab.lengths)
    held_batch = make_batch(held, seq2seq)
    rng = random.Random(f"{lab.task}-{lab.seed}-train")
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trained if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in trained if not (p.ndim >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=lab.lr, betas=(0.9, 0.98), eps=1e-9)
    run.initial_entropy = attention_entropy(model, held_batch, lab)
    if 0 in lab.snapshot_steps:  # the untrained model's attention
        run.snapshots[0] = lab_attention(model, lab.family, held[0][0], held[0][1], approx=lab_approx(lab))
    started, tokens = time.perf_counter(), 0
    for step in range(lab.steps):
        if (stop is not None and stop()) or (lab.time_budget and time.perf_counter() - started > lab.time_budget):
            run.stopped = True
            break
        pairs = []
        while len(pairs) < lab.batch:
            source, target = TASKS[lab.task](rng, *lab.lengths)
            if not held_out(source):
                pairs.append((source, target))
        batch = make_batch(pairs, seq2seq)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, lab)
        model.train()
        loss = loss_of(model, batch, lab)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens += batch.n_tokens
        elapsed = time.perf_counter() - started
        progress = Progress(step + 1, loss.item(), tokens_per_s=tokens / elapsed, seconds=elapsed)
        if (step + 1) % lab.eval_every == 0 or step + 1 == lab.steps:
            evaluate(run, progress, held, held_batch)
        if step + 1 in lab.snapshot_steps:
            model.eval()
            run.snapshots[step + 1] = lab_attention(model, lab.family, held[0][0], held[0][1], approx=lab_approx(lab))
        run.history.append(progress)
        yield run, progress
    if run.stopped and not run.history:  # stopped before its first step: the caller still gets the run
        progress = Progress(0, float("nan"))
        evaluate(run, progress, held, held_batch)
        run.history.append(progress)
        yield run, progress
    elif run.stopped and run.history[-1].exact_match is None:
        evaluate(run, run.history[-1], held, held_batch)
        yield run, run.history[-1]
    model.eval()


def evaluate(run: Run, progress: Progress, held, held_batch: Batch) -> None:
    model = run.model
    model.eval()
    with torch.inference_mode():
        progress.held_loss = loss_of(model, held_batch, run.lab).item()
        progress.exact_match = exact_match(model, held, run.lab.family == "marian", lab_approx(run.lab))


def attention_entropy(model: Transformer, batch: Batch, lab: LabConfig) -> list[float]:
    """Mean entropy (nats) of the decoder's self-attention rows per layer, on real query rows; none ([]) for
    differential attention, whose map is a signed difference of two distributions, not one."""
    if lab.attention == "differential":
        return []
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        out = model(**batch.inputs, causal_mask=lab.causal_mask, capture_attention=True, approx=lab_approx(lab))
    model.train(was_training)
    rows = (batch.labels != -100) if lab.family == "marian" else batch.inputs["attention_mask"].bool()
    return [row_entropy(p).mean(1)[rows].mean().item() for p in out.attentions]


def lab_attention(model: Transformer, family: str, source: str, target: str | None = None,
                  approx: Approx | None = None) -> LabAttention:
    """The attention of a lab model on one source and its target (the model's own greedy answer by default);
    approx: the run's own approximation (lab_approx), whose maps are then the ones shown. A differential run's maps
    are its difference maps (core.model.Attention.attend_differential), which may be negative."""
    unknown = sorted(set(source + (target or "")) - set(CHARS))
    if unknown:
        raise ValueError(f"characters outside the lab's vocabulary: {''.join(unknown)!r}; it has {''.join(CHARS)!r}")
    seq2seq = family == "marian"
    longest = 40 if seq2seq else 20  # a decoder-only sequence holds source and target: 2·20 + 3 ≤ 64 positions
    if not source or len(source) > longest:
        raise ValueError(f"the source must have 1 to {longest} characters, got {len(source)}")
    model.eval()
    with torch.inference_mode():
        if target is None:
            src = torch.tensor([encode(source) + [EOS]])
            if seq2seq:
                target = decode(model.generate(src, 40)[0, 1:].tolist())
            else:
                prompt = torch.tensor([[BOS] + encode(source) + [SEP]])
                target = decode(greedy(model, prompt, 40, approx=approx)[0, prompt.shape[1]:].tolist())
        batch = make_batch([(source, target)], seq2seq)
        out = model(**batch.inputs, capture_attention=True, approx=approx)
    stack = lambda maps: torch.stack([m[0] for m in maps]) if maps else None  # noqa: E731
    if seq2seq:
        return LabAttention(list(source) + ["<eos>"], ["<bos>"] + list(target), stack(out.attentions),
                            stack(out.encoder_attentions), stack(out.cross_attentions))
    tokens = ["<bos>"] + list(source) + ["<sep>"] + list(target) + ["<eos>"]
    return LabAttention(tokens, tokens, stack(out.attentions))


def alignment(maps: LabAttention, expected) -> float:
    """The share of target positions whose cross-attention (last layer, mean over heads) peaks on the source
    position `expected(i)` says, for the target's characters (i = 0, 1, ...)."""
    if maps.cross is None:
        raise ValueError("alignment reads cross-attention: an encoder-decoder model's")
    peaks = maps.cross[-1].mean(0).argmax(-1)                     # [T]: rows <bos>, c0, c1, ...
    n = len(maps.target_tokens) - 1
    return sum(int(peaks[i]) == expected(i) for i in range(n)) / max(1, n)


# ---- saving: the weight store's layout, readable by transformers where the family allows ----

def standard(lab: LabConfig) -> bool:
    """Whether transformers' own class for the family computes what this model computes."""
    family_norm = "post" if lab.family == "marian" else "pre"
    family_positions = "sinusoidal" if lab.family == "marian" else "rope"
    return lab.scale and (lab.norm or family_norm) == family_norm and (lab.positions or family_positions) == family_positions


def hf_config(lab: LabConfig) -> dict:
    if lab.sinks:   # gpt-oss has the term, but no family table here reads it
        raise ValueError("a run with learned sinks is measured where it trains (core.lab.sinks), not saved as a "
                         "checkpoint: no family here loads its sink logits")
    if lab.attention in ("gated", "differential"):
        raise ValueError(f"a run with {lab.attention} attention is measured where it trains (core.lab.variants), not "
                         "saved as a checkpoint: no family here loads its weights")
    cfg = model_config(lab)
    common = dict(vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_positions, pad_token_id=PAD,
                  bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=True)
    if lab.family == "marian":
        raw = dict(model_type="marian", architectures=["MarianMTModel"], d_model=cfg.d_model,
                   encoder_layers=cfg.n_layers, decoder_layers=cfg.n_layers, encoder_attention_heads=cfg.n_heads,
                   decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                   activation_function="relu", scale_embedding=lab.embed_scale, decoder_start_token_id=BOS,
                   share_encoder_decoder_embeddings=True, forced_eos_token_id=None, **common)
    else:
        raw = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=cfg.d_model,
                   intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                   num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
                   rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, attention_bias=False, mlp_bias=False, **common)
    if not standard(lab):  # what the family's own reader would get wrong; core.loading applies it
        raw["attention_explorer"] = dict(positional=cfg.positional, norm_placement=cfg.norm_placement,
                                         scale_attention=cfg.scale_attention, score_bias=cfg.score_bias)
    return raw


def checkpoint_tensors(model: Transformer, family_module) -> dict[str, Tensor]:
    """Our parameters under the checkpoint's names (the family's weight table read backwards): fused q/k/v and
    gate/up rows split again, the family's prefix put back where its checkpoints have it."""
    prefix = family_module.PREFIXES[0]
    out = {}
    for name, param in model.named_parameters():  # each tensor once: a shared table under its first name
        template = re.sub(r"\.(\d+)\.", ".{}.", name, count=1)
        layer = re.search(r"\.(\d+)\.", name)
        theirs = family_module.WEIGHTS[template][0]
        names = [n.format(layer.group(1) if layer else "") for n in (theirs if isinstance(theirs, tuple) else (theirs,))]
        for pattern, transform in getattr(family_module, "TO_CHECKPOINT", {}).items():
            if re.search(pattern, name):
                param = transform(param, model.config)
        parts = param.split(split_sizes(model, name, len(names))) if len(names) > 1 else [param]
        for n, t in zip(names, parts):
            top_level = n.startswith("lm_head") or n == "final_logits_bias"
            out[n if top_level else prefix + n] = t.detach().contiguous().clone()
    return out


def split_sizes(model: Transformer, name: str, n: int) -> list[int]:
    cfg = model.config
    if ".attn.qkv." in name:
        return [cfg.n_heads * cfg.head_dim] + [cfg.n_kv_heads * cfg.head_dim] * 2
    size = model.get_parameter(name).shape[0]
    return [size // n] * n


def write_tokenizer(folder: Path) -> None:
    """A character-level tokenizer that transformers' AutoTokenizer reads (tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="PreTrainedTokenizerFast", pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        sep_token="<sep>")))


def save(run: Run, folder: str | Path) -> Path:
    """The run as a model folder in the weight store's layout: config.json, model.safetensors, tokenizer files and
    the store's manifest.json, whose source records the task, the seed and the lab config."""
    from safetensors.torch import save_file
    from ..families import family_for
    from ..store.manifest import write_manifest
    if run.lab.positions == "relative":
        raise ValueError("a run with T5-style relative positions cannot be kept: the Llama layout its folder uses "
                         "has no place for the bias table")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw = hf_config(run.lab)
    save_file(checkpoint_tensors(run.model, family_for(raw)), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    write_tokenizer(folder)
    final = run.final
    source = dict(type="trained", task=run.lab.task, seed=run.lab.seed, lab=asdict(run.lab),
                  steps=run.history[-1].step if run.history else 0, exact_match=final.exact_match if final else None,
                  transformers_compatible=standard(run.lab))
    write_manifest(folder, folder.name, source, licence="trained here; yours")
    return folder


def threads_argument(parser: argparse.ArgumentParser) -> None:
    """--threads for the Lab's experiments' command lines (see set_threads)."""
    parser.add_argument("--threads", type=int, help="torch's threads (default: its own choice); the same count "
                                                     "repeats a run exactly")


def set_threads(threads: int | None) -> str | None:
    """torch's thread count, as --threads asked (None: left as it is); the error in words, or None."""
    if threads is None:
        return None
    if threads < 1:
        return f"--threads must be at least 1, got {threads}"
    torch.set_num_threads(threads)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.lab.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="reverse", choices=list(TASKS))
    parser.add_argument("--family", default="marian", choices=["marian", "llama"])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--positions", choices=list(POSITION_KINDS))
    parser.add_argument("--no-positions", action="store_true", help="the same as --positions none")
    parser.add_argument("--no-causal-mask", action="store_true")
    parser.add_argument("--no-scale", action="store_true")
    parser.add_argument("--norm", choices=["pre", "post"])
    parser.add_argument("--no-embed-scale", action="store_true",
                        help="Marian layout: token embeddings enter unscaled, not times sqrt(d_model)")
    parser.add_argument("--attention-only", action="store_true",
                        help="decoder only: blocks without MLPs (their output weights zero and frozen)")
    parser.add_argument("--attention", default="softmax", choices=list(ATTENTIONS),
                        help="exact softmax, Performer's FAVOR+ (decoder only), gated or differential attention")
    parser.add_argument("--features", type=int, default=64, help="performer: random features per head")
    parser.add_argument("--lengths", type=int, nargs=2, default=(8, 12), metavar=("SHORTEST", "LONGEST"),
                        help="source lengths in characters (1–20)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--out", help="save the trained model to this folder")
    args = parser.parse_args(argv)
    lab = LabConfig(task=args.task, family=args.family, steps=args.steps, seed=args.seed, n_layers=args.layers,
                    d_model=args.d_model, n_heads=args.heads, d_ff=args.d_ff, lr=args.lr,
                    positions="none" if args.no_positions else args.positions, norm=args.norm,
                    causal_mask=not args.no_causal_mask, scale=not args.no_scale,
                    embed_scale=not args.no_embed_scale, eval_every=args.eval_every,
                    attention_only=args.attention_only, lengths=tuple(args.lengths), attention=args.attention,
                    performer_features=args.features)
    try:
        lab.check()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run = None
    for run, p in train(lab):
        if p.exact_match is not None:
            print(f"step {p.step:>5}  train loss {p.train_loss:.4f}  held-out loss {p.held_loss:.4f}  "
                  f"exact match {p.exact_match:.1%}  {p.tokens_per_s:,.0f} tokens/s  {p.seconds:.1f} s", flush=True)
    if args.out and run is not None:
        print(f"saved to {save(run, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
