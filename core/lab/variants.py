"""Efficient and gated attention in the Lab: the small decoder trained with exact softmax, Performer, gated and
differential attention at the same budget, on the copy task and the induction task, then measured the same way.

    python -m core.lab.variants [--seeds 0 1] [--copy-steps N] [--induction-steps N] [--features 64] [--threads 1]
                                [--out assets/variants]
    python -m core.lab.variants --render [--out assets/variants]    (docs/lab.md's section from the saved run)

The four attentions are LabConfig.attention's choices (core.lab.train): "softmax", eq. 2.1; "performer", FAVOR+
(Choromanski et al.) through core.approx on every layer in training and evaluation, its random features fixed for a
run (seeded by the run's seed); "gated", a sigmoid gate on each head's output before W_O (Qiu et al. 2025, G1);
"differential", two softmaxes subtracted, heads 2i and 2i+1 forming one differential head as in the paper's layout
(Ye et al. 2025, core.model.Attention.attend_differential). Every variant of a task gets the same model size, seed,
batches, learning rate and number of steps; the gate adds H·d_k·d weights per layer, differential attention 6·d_k
numbers per layer (its four λ vectors and its norm's gain).

Two tasks, both the Lab's copy-62 generator (<bos> s <sep> s <eos>, s random letters and digits, the loss on the
copy; the 26-letter "copy" repeats letters within a text, and in a trial at this budget two layers had not learned
it):
  copy       s of 8 to 16 symbols; the Lab's decoder-only Llama layout with its MLPs, 2 layers;
  induction  s of 8 to 20 symbols; the attention-only 2-layer decoder whose induction circuit core.lab.induction
             reads (the configuration of assets/lessons/induction, docs/core.md).
The seeds are 0 and 2: seed 1 of the induction configuration stays on its plateau for 2,000 steps with softmax
(docs/core.md's seeds table), and a comparison needs a baseline that learned.

Measured on held-out texts, for each run (MEASURES says each in words): exact match (the Lab's held-out greedy
decoding); accuracy at the trained longest length and past it (core.lab.extrapolation.scored: target tokens predicted
right after the right prefix, and whole texts right); every head's first-token mass (core.analysis.heads
.first_token_mass) and the share of heads above ε (sink_heads, Sink^ε); on the induction task, whether the circuit
forms (core.lab.induction.circuit, decided by core.analysis.circuits.induction_circuit). Each map is the variant's
own: Performer's normalised φ(q)·φ(k), the gated head's softmax (the gate scales the head's output, not its weights),
and the differential head's difference map (heads 2i and 2i+1 both show differential head i's), whose entries may
be negative, so its first-token mass is the net weight on <bos>. The circuit's key trace (core.analysis.qk.composition_over) splits one softmax's score q·k: for Performer it
reads the exact softmax of the same q and k (the kernel FAVOR+ estimates), and for differential attention, whose
map weighs a difference of two softmaxes (Q₁K₁ᵀ and Q₂K₂ᵀ), no trace is made: its scores are kept and its circuit
left undecided, in words.

Float sums depend on the thread count, so a run repeats exactly only at the same one: the result records it, and
--threads sets it.
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

import torch

from ..analysis.circuits import INDUCTION_MIN, PREVIOUS_MIN
from ..analysis.heads import SINK_EPSILON, first_token_mass, sink_heads
from . import extrapolation, induction
from . import train as lab_engine
from .train import ATTENTIONS, LabConfig, Run

TASKS = ("copy", "induction")
# each task's run: the Lab's task generator, its lengths, and the model every variant of it shares
TASK_RUNS = {
    "copy": dict(task="copy-62", family="llama", n_layers=2, d_model=32, n_heads=4, d_ff=64, lengths=(8, 16),
                 lr=2e-3, warmup=100, batch=64),
    "induction": dict(task="copy-62", family="llama", attention_only=True, n_layers=2, d_model=32, n_heads=4,
                      d_ff=256, lengths=(8, 20), lr=2e-3, warmup=100, batch=64),
}
MEASURES = {
    "exact_match": "held-out texts of the trained lengths that greedy decoding copies whole",
    "accuracy": "target tokens (symbols and <eos>) predicted right after the right prefix, per copied length",
    "exact": "texts with every target token right (what greedy decoding copies whole), per copied length",
    "first_token": "each head's mean weight on <bos> over the queries after it, [layer][head], at the trained "
                   "longest length (differential: the net weight of its difference map)",
    "sink_share": f"the share of heads whose first-token mass exceeds ε = {SINK_EPSILON} (Sink^ε)",
    "circuit": "induction task: a previous-token head feeding the strongest induction head's keys "
               "(core.analysis.circuits)",
    "gate_mean": "gated: each layer's mean gate value σ(x·W_g) over every token and channel of the tested texts",
    "lambdas": "differential: each layer's λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init after training",
}


@dataclass
class VariantsConfig:
    variants: tuple[str, ...] = ATTENTIONS
    tasks: tuple[str, ...] = TASKS
    seeds: tuple[int, ...] = (0, 2)
    copy_steps: int = 1200
    induction_steps: int = 2000
    features: int = 64              # Performer's random features per head
    test_examples: int = 100        # held-out texts per tested length
    circuit_texts: int = induction.TEXTS

    def steps(self, task: str) -> int:
        return self.copy_steps if task == "copy" else self.induction_steps

    def test_lengths(self, task: str) -> tuple[int, int]:
        """The trained longest length and twice it: where accuracy is tested."""
        longest = TASK_RUNS[task]["lengths"][1]
        return longest, 2 * longest

    def lab(self, task: str, variant: str, seed: int) -> LabConfig:
        """One run's LabConfig: the task's shared model and budget, the variant's attention. Its positions table
        (unused under RoPE) spans the longest test text."""
        steps = self.steps(task)
        return LabConfig(**TASK_RUNS[task], steps=steps, seed=seed, attention=variant,
                         performer_features=self.features, eval_every=steps, eval_examples=self.test_examples,
                         max_len=extrapolation.sequence_length(self.test_lengths(task)[1]))

    def check(self) -> None:
        for name, values, known in (("variants", self.variants, ATTENTIONS), ("tasks", self.tasks, TASKS)):
            if not values or len(set(values)) != len(values) or any(v not in known for v in values):
                raise ValueError(f"{name} must be distinct names among {', '.join(known)}, got {list(values)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be distinct whole numbers ≥ 0, got {list(self.seeds)}")
        for name, value, low, high in (("copy_steps", self.copy_steps, 1, 100_000),
                                       ("induction_steps", self.induction_steps, 1, 100_000),
                                       ("test_examples", self.test_examples, 1, 1000),
                                       ("circuit_texts", self.circuit_texts, 2, 200)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        for task in self.tasks:
            for variant in self.variants:
                self.lab(task, variant, self.seeds[0]).check()   # the Lab's own limits, in its words


@dataclass
class VariantResult:
    """One (task, variant, seed) trained and measured; MEASURES says what each number is. Lengths are keys of
    accuracy and exact (copied symbols). circuit: the induction task's finding (None on the copy task)."""
    task: str
    variant: str
    seed: int
    steps: int
    seconds: float                  # training's wall time (measuring the run not included)
    parameters: int                 # trained parameters
    train_loss: float
    held_loss: float
    exact_match: float
    accuracy: dict[int, float] = field(default_factory=dict)
    exact: dict[int, float] = field(default_factory=dict)
    first_token: list[list[float]] = field(default_factory=list)
    sink_max: float = 0.0           # the largest head's first-token mass
    sink_share: float = 0.0         # Sink^ε
    circuit: dict | None = None
    gate_mean: list[float] | None = None     # gated: each layer's mean gate σ(x·W_g) over the tested texts' tokens
    lambdas: list[float] | None = None       # differential: each layer's learned λ


@dataclass
class Variants:
    config: VariantsConfig
    runs: list[VariantResult]
    date: str
    seconds: float
    command: str = ""
    stopped: bool = False
    threads: int = 0

    def run(self, task: str, variant: str, seed: int) -> VariantResult | None:
        return next((r for r in self.runs if (r.task, r.variant, r.seed) == (task, variant, seed)), None)


def circuit_record(model, lab: LabConfig, texts: list[torch.Tensor]) -> dict:
    """The induction circuit of a trained two-layer decoder as plain values: both scores of every head (on the
    variant's own maps) and the decision, or, for differential attention, the scores and why none is decided."""
    approx = lab_engine.lab_approx(lab)
    if lab.attention == "differential":
        previous, scores = induction.scores(model, texts)
        head = divmod(int(scores[1:].argmax()) + scores.shape[1], scores.shape[1])
        return dict(found=None, previous_token=rounded(previous), induction=rounded(scores),
                    induction_head=list(head), induction_score=round(float(scores[head]), 4),
                    words="undecided: the key trace splits one softmax's score q·k, and a differential head weighs "
                          "a difference of two (Q₁K₁ᵀ and Q₂K₂ᵀ)")
    found = induction.circuit(model, texts, approx=approx)
    finding = found.finding
    record = dict(found=finding.found, previous_token=rounded(found.previous_token),
                  induction=rounded(found.induction), induction_head=[finding.induction.layer, finding.induction.head],
                  induction_score=round(finding.induction_score, 4), words=finding.words())
    if finding.source is not None:
        record.update(source=[finding.source.layer, finding.source.head], source_share=round(finding.source_share, 4),
                      source_previous=round(finding.source_previous, 4))
    return record


def gate_means(model, pairs: list[tuple[str, str]]) -> list[float]:
    """Each layer's mean gate σ(x·W_g) over the texts' tokens (the layer's recorded input x) and channels."""
    batch = lab_engine.make_batch(pairs, seq2seq=False)
    with torch.inference_mode():
        records = model(**batch.inputs, record=("attn_in",), return_logits=False).records["attn_in"]
        return [round(float(torch.sigmoid(block.attn.gate(x)).mean()), 4)
                for block, x in zip(model.stack.blocks, records)]


def rounded(table: torch.Tensor) -> list[list[float]]:
    return [[round(float(x), 4) for x in row] for row in table]


def measure(run: Run, config: VariantsConfig, task: str) -> VariantResult:
    """Test one trained run: accuracy at the trained longest length and past it, first-token mass at the former,
    and (induction task) the circuit."""
    model, lab = run.model, run.lab
    model.eval()
    approx = lab_engine.lab_approx(lab)
    last, final = run.history[-1], run.final
    result = VariantResult(task, lab.attention, lab.seed, last.step, round(last.seconds, 1),
                           sum(p.numel() for p in model.parameters() if p.requires_grad), round(last.train_loss, 4),
                           round(final.held_loss, 4), round(final.exact_match, 4))
    trained = config.test_lengths(task)[0]
    for symbols in config.test_lengths(task):
        pairs = lab_engine.examples(lab.task, lab.seed, config.test_examples, True, (symbols, symbols))
        right, wanted, maps = extrapolation.scored(model, pairs, approx=approx)
        result.accuracy[symbols] = round(right.sum().item() / wanted.sum().item(), 4)
        result.exact[symbols] = round((right | ~wanted).all(1).float().mean().item(), 4)
        if symbols == trained:
            mass = torch.stack([first_token_mass(p, causal=True).mean(0) for p in maps])      # [L, H]
            result.first_token = rounded(mass)
            result.sink_max = round(float(mass.max()), 4)
            result.sink_share = round(float(sink_heads(mass).float().mean()), 4)
            if lab.attention == "gated":
                result.gate_mean = gate_means(model, pairs)
    if lab.attention == "differential":
        with torch.no_grad():
            result.lambdas = [round(float(b.attn.differential_lambda(i)[0]), 4)
                              for i, b in enumerate(model.stack.blocks)]
    if task == "induction":
        texts = induction.probe_texts(config.circuit_texts)
        result.circuit = circuit_record(model, lab, texts)
    return result


def variants(config: VariantsConfig, stop: Callable[[], bool] | None = None,
             progress: Callable[[str, str, int, int, int], None] | None = None) -> Iterator[VariantResult]:
    """Train and measure every (task, seed, variant) in turn, yielding each result when it is done.
    progress(task, variant, seed, step, steps) after every step; stop() is asked before every step, and a run
    stopped half-way yields nothing."""
    config.check()
    for task in config.tasks:
        for seed in config.seeds:
            for variant in config.variants:
                run = None
                for run, p in lab_engine.train(config.lab(task, variant, seed), stop=stop):
                    if progress is not None:
                        progress(task, variant, seed, p.step, config.steps(task))
                if run is None or run.stopped:
                    return
                yield measure(run, config, task)


def run_all(config: VariantsConfig, stop=None, progress=None, command: str = "") -> Variants:
    started = time.perf_counter()
    runs = list(variants(config, stop, progress))
    expected = len(config.tasks) * len(config.seeds) * len(config.variants)
    return Variants(config, runs, datetime.date.today().isoformat(), round(time.perf_counter() - started, 1),
                    command, stopped=len(runs) < expected, threads=torch.get_num_threads())


# ---- saving: one JSON file ----

def summary(runs: list[dict]) -> dict:
    """Per task and variant, over its seeds: the mean of each measure (accuracy at every tested length) and how
    many runs named the circuit (of those decided)."""
    out: dict = {}
    for r in runs:
        out.setdefault(r["task"], {}).setdefault(r["variant"], []).append(r)
    mean = lambda values: round(sum(values) / len(values), 4)                    # noqa: E731
    for task, by_variant in out.items():
        for variant, group in by_variant.items():
            decided = [r["circuit"]["found"] for r in group if r["circuit"] and r["circuit"]["found"] is not None]
            by_variant[variant] = dict(
                seeds=len(group), exact_match=mean([r["exact_match"] for r in group]),
                accuracy={n: mean([r["accuracy"][n] for r in group]) for n in group[0]["accuracy"]},
                sink_max=mean([r["sink_max"] for r in group]), sink_share=mean([r["sink_share"] for r in group]),
                seconds=mean([r["seconds"] for r in group]),
                circuits=None if task != "induction" else dict(named=sum(decided), decided=len(decided)))
    return out


def as_dict(result: Variants) -> dict:
    """The result as its JSON reads back (lengths as string keys)."""
    runs = json.loads(json.dumps([asdict(r) for r in result.runs]))
    return dict(command=result.command, date=result.date, seconds=result.seconds, threads=result.threads,
                stopped=result.stopped, config=asdict(result.config), task_runs=TASK_RUNS,
                test_lengths={task: list(result.config.test_lengths(task)) for task in result.config.tasks},
                measures=MEASURES,
                thresholds=dict(epsilon=SINK_EPSILON, induction_min=INDUCTION_MIN, previous_min=PREVIOUS_MIN),
                summary=summary(runs), runs=runs)


def save(result: Variants, folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps(as_dict(result), indent=1, ensure_ascii=False), encoding="utf-8")
    return folder


def load(folder: str | Path) -> Variants:
    raw = json.loads((Path(folder) / "result.json").read_text(encoding="utf-8"))
    config = VariantsConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw["config"].items()})
    runs = [VariantResult(**{**r, "accuracy": {int(n): v for n, v in r["accuracy"].items()},
                             "exact": {int(n): v for n, v in r["exact"].items()}}) for r in raw["runs"]]
    return Variants(config, runs, raw["date"], raw["seconds"], raw.get("command", ""), raw.get("stopped", False),
                    raw.get("threads", 0))


# ---- the result in words: a plain table for the terminal, a section for docs/lab.md ----

def circuit_cell(run: dict) -> str:
    c = run.get("circuit")
    if c is None:
        return "—"
    head = f"L{c['induction_head'][0]} H{c['induction_head'][1]} ({c['induction_score']:.2f})"
    if c["found"] is None:
        return f"undecided; induction {head}"
    if "source" not in c:
        return f"{'yes' if c['found'] else 'no'}; induction {head}"
    source = f"L{c['source'][0]} H{c['source'][1]}"
    return (f"{'yes' if c['found'] else 'no'}; induction {head}, keys fed most by {source} "
            f"(previous-token {c['source_previous']:.2f})")


def rows(raw: dict, task: str) -> list[list[str]]:
    """One row per run of `task`: variant, seed, exact match, accuracy and whole copies at each tested length, the
    largest first-token mass, Sink^ε, the circuit."""
    out = []
    for r in raw["runs"]:
        if r["task"] != task:
            continue
        lengths = sorted(r["accuracy"], key=int)
        out.append([r["variant"], str(r["seed"]), f"{r['exact_match']:.2f}",
                    *(f"{r['accuracy'][n]:.2f}" for n in lengths), *(f"{r['exact'][n]:.2f}" for n in lengths),
                    f"{r['sink_max']:.2f}", f"{r['sink_share']:.2f}", f"{r['train_loss']:.3f}",
                    f"{r['parameters']:,}", f"{r['seconds']:.0f}"] + ([circuit_cell(r)] if task == "induction" else []))
    return out


def header(raw: dict, task: str) -> list[str]:
    first = next(r for r in raw["runs"] if r["task"] == task)
    lengths = sorted(first["accuracy"], key=int)
    return (["attention", "seed", "exact match"] + [f"accuracy at {n}" for n in lengths]
            + [f"whole at {n}" for n in lengths]
            + ["largest <bos> mass", "Sink^ε", "train loss", "parameters", "training seconds"]
            + (["circuit"] if task == "induction" else []))


def md_table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def summary_rows(raw: dict, task: str) -> tuple[list[str], list[list[str]]]:
    """The summary table of `task`: one row per variant, means over its seeds."""
    lengths = raw["test_lengths"][task]
    head = (["attention", "seeds", "exact match"] + [f"accuracy at {n}" for n in lengths]
            + ["largest <bos> mass", "Sink^ε"] + (["circuit named"] if task == "induction" else [])
            + ["training seconds"])
    body = []
    for variant, s in raw["summary"][task].items():
        circuits = s["circuits"]
        named = [] if circuits is None else [
            f"{circuits['named']} of {circuits['decided']}" if circuits["decided"] else "undecided"]
        body.append([variant, str(s["seeds"]), f"{s['exact_match']:.2f}",
                     *(f"{s['accuracy'][str(n)]:.2f}" for n in lengths),
                     f"{s['sink_max']:.2f}", f"{s['sink_share']:.2f}", *named, f"{s['seconds']:.0f}"])
    return head, body


def findings(raw: dict, task: str) -> str:
    """Which variant is highest and lowest on each measure of the summary, in words, with its value."""
    by_variant = raw["summary"][task]
    past = str(raw["test_lengths"][task][1])
    words = []
    for name, what, value in (("exact_match", "exact match", lambda s: s["exact_match"]),
                              ("past", f"accuracy at {past} symbols", lambda s: s["accuracy"][past]),
                              ("sink_max", "largest <bos> mass", lambda s: s["sink_max"])):
        shown = {v: f"{value(s):.2f}" for v, s in by_variant.items()}          # as the table prints them
        ends = []
        for end in (max, min):
            top = end(shown.values(), key=float)
            ends.append(f"{' and '.join(v for v in shown if shown[v] == top)} ({top})")
        words.append(f"{what} is highest with {ends[0]} and lowest with {ends[1]}")
    return "Means over the seeds: " + "; ".join(words) + "."


def section(raw: dict) -> str:
    """docs/lab.md's results, every figure read from the saved run `raw` (as_dict's form, read back from JSON)."""
    c, th = raw["config"], raw["thresholds"]
    threads = f"{raw['threads']} thread{'s' if raw['threads'] != 1 else ''}"
    parts = [f"_Written by `{raw['command']}` on {raw['date']}: {raw['seconds']:.0f} s on {threads}; seeds {', '.join(map(str, c['seeds']))}; Performer with {c['features']} random features "
             f"per head; each length tested on {c['test_examples']} held-out texts._"]
    for task in c["tasks"]:
        if task not in raw["summary"]:
            continue
        t = raw["task_runs"][task]
        shape = (f"{t['n_layers']} layers, d_model {t['d_model']}, {t['n_heads']} heads"
                 + (", attention only" if t.get("attention_only") else f", d_ff {t['d_ff']}"))
        steps = c["copy_steps"] if task == "copy" else c["induction_steps"]
        parts.append(f"**{task}** (`{t['task']}`, {t['lengths'][0]} to {t['lengths'][1]} symbols; {shape}; "
                     f"{steps} steps of {t['batch']} texts, lr {t['lr']}), means over the seeds:\n\n"
                     + md_table(*summary_rows(raw, task)) + "\n\n" + findings(raw, task))
    for task in c["tasks"]:
        if task in raw["summary"]:
            parts.append(f"Each {task} run:\n\n" + md_table(header(raw, task), rows(raw, task)))
    parts.append(f"A head is a sink head when its first-token mass exceeds ε = {th['epsilon']}; a circuit is named "
                 f"where the induction score is at least {th['induction_min']} and the earlier head feeding its keys "
                 f"most is a previous-token head (score at least {th['previous_min']}).")
    return "\n\n".join(parts)


def table(result: Variants) -> str:
    raw = as_dict(result)
    out = []
    for task in result.config.tasks:
        if any(r.task == task for r in result.runs):
            head, body = header(raw, task), rows(raw, task)
            widths = [max(len(x) for x in col) for col in zip(head, *body)]
            out += [task] + ["  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [head, *body]] + [""]
    return "\n".join(out)


DOC = Path(__file__).resolve().parents[2] / "docs" / "lab.md"
MARKS = ("<!-- variants start -->", "<!-- variants end -->")


def render(folder: str | Path, doc: Path = DOC) -> None:
    """Write the saved run's section between the marks in docs/lab.md."""
    raw = json.loads((Path(folder) / "result.json").read_text(encoding="utf-8"))
    text = doc.read_text(encoding="utf-8")
    start, end = text.index(MARKS[0]), text.index(MARKS[1])
    doc.write_text(text[:start] + MARKS[0] + "\n" + section(raw) + "\n" + text[end:], encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m core.lab.variants", description=__doc__.split("\n\n")[0])
    defaults = VariantsConfig()
    parser.add_argument("--seeds", type=int, nargs="+", default=list(defaults.seeds))
    parser.add_argument("--variants", default=",".join(defaults.variants),
                        help=f"comma-separated among {', '.join(ATTENTIONS)}")
    parser.add_argument("--tasks", default=",".join(defaults.tasks), help=f"comma-separated among {', '.join(TASKS)}")
    parser.add_argument("--copy-steps", type=int, default=defaults.copy_steps)
    parser.add_argument("--induction-steps", type=int, default=defaults.induction_steps)
    parser.add_argument("--features", type=int, default=defaults.features, help="Performer's random features per head")
    parser.add_argument("--test-examples", type=int, default=defaults.test_examples)
    lab_engine.threads_argument(parser)
    parser.add_argument("--out", help="save the result (result.json) to this folder")
    parser.add_argument("--render", action="store_true",
                        help="write docs/lab.md's section from --out's saved result.json; nothing is trained")
    args = parser.parse_args(argv)
    if args.render:
        if not args.out:
            print("error: --render reads the saved run in --out", file=sys.stderr)
            return 2
        render(args.out)
        return 0
    error = lab_engine.set_threads(args.threads)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config = VariantsConfig(variants=tuple(args.variants.split(",")), tasks=tuple(args.tasks.split(",")),
                            seeds=tuple(args.seeds), copy_steps=args.copy_steps,
                            induction_steps=args.induction_steps, features=args.features,
                            test_examples=args.test_examples)
    try:
        config.check()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    done = lambda task, variant, seed, step, steps: step == steps and print(   # noqa: E731
        f"{task}, {variant}, seed {seed}: {steps} steps trained", flush=True)
    result = run_all(config, progress=done, command=" ".join(["python -m core.lab.variants", *argv]))
    print(f"{result.date}, {result.seconds:.0f} s, threads: {torch.get_num_threads()}\n")
    print(table(result))
    if args.out:
        print(f"saved to {save(result, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
