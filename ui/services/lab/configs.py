"""The training lab's configurations: the page's fields checked into a LabConfig (core.lab.train), the comparisons
("break it on purpose": the same config twice, one switch apart) and the sentence each comparison's numbers give."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from core.lab import train as engine
from core.lab.train import LabConfig
from ui.services.checks import UserError, check_choice, check_float, check_range
from ui.settings import LabSettings

FAMILIES = {"marian": "encoder-decoder (MarianMT's layout)", "llama": "decoder only (Llama's layout)"}
# families of core/families that the app loads but the Lab does not train (lab_family_reason says so)
TRAINED_ELSEWHERE = ("gpt2", "bert", "gpt_neox", "bloom", "opt", "mistral", "qwen3", "phi3", "gemma", "gemma2",
                     "gemma3", "t5")
POSITIONS = ("default", "sinusoidal", "learned", "rope", "none")  # "default": the family's own
NORMS = ("default", "pre", "post")
MAX_RUNS_PER_SESSION = 8  # older finished runs are dropped: each holds its model in memory
MAX_SNAPSHOTS = 8
MAX_DECODER_SOURCE = 20  # <bos> source <sep> and up to 40 generated tokens must fit the model's 64 positions
SESSION_IDLE_S = 3600
POLL_S = 0.5  # how often a follower looks at its job
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
LIMITS = dict(n_layers=(1, 4), d_model=(32, 256), n_heads=(1, 8), d_ff=(1, 1024), seed=(0, 2**31 - 1))
# The Lab tab's fields as the page opens (make_config's parameters): the core's default run (core.lab.train
# DEFAULT_RUN), which bench/lab_snapshots.py measures; "default" is the page's word for the family's own choice.
DEFAULT_FIELDS = {name: getattr(engine.DEFAULT_RUN, name) for name in (
    "task", "family", "n_layers", "d_model", "n_heads", "d_ff", "dropout", "causal_mask", "scale", "seed", "steps", "lr")}
DEFAULT_FIELDS.update(positions=engine.DEFAULT_RUN.positions or "default", norm=engine.DEFAULT_RUN.norm or "default")
DEFAULT_SNAPSHOT_STEPS = ", ".join(map(str, engine.DEFAULT_RUN.snapshot_steps))
TABLE_COLUMNS = ("run", "label", "task", "model", "steps", "status", "final training loss", "held-out loss",
                 "exact match", "entropy at init (nats)", "tokens/s", "seconds")


# ---------------------------------------------------------------- configs


def parse_steps_list(text, steps: int) -> tuple[int, ...]:
    """'50, 150, 600' → (50, 150, 600): the steps after which the attention is kept."""
    parts = [p for p in re.split(r"[,\s]+", str(text or "").strip()) if p]
    out = set()
    for p in parts:
        if not (p.isascii() and p.isdigit() and len(p) <= 9):
            raise UserError(f"Snapshot steps must be whole numbers separated by commas, got {p!r}.")
        if not 1 <= int(p) <= steps:
            raise UserError(f"Snapshot steps must be between 1 and {steps} (the run's length), got {p}.")
        out.add(int(p))
    if len(out) > MAX_SNAPSHOTS:
        raise UserError(f"At most {MAX_SNAPSHOTS} snapshot steps, got {len(out)}.")
    return tuple(sorted(out))


def lab_family_reason(family) -> str:
    """Why the Lab will not train `family`: it trains two layouts from scratch; the others load for analysis."""
    known = f"{family!r} is a family the app loads and analyses, but " if family in TRAINED_ELSEWHERE else ""
    return (f"Family must be 'marian' (encoder-decoder) or 'llama' (decoder only), got {family!r}: {known}the Lab "
            "trains only these two layouts from scratch on its toy tasks (its switches: positions, norm placement, "
            "causal mask, scale); to look at another family, load one of its checkpoints in the other tabs.")


def make_config(settings: LabSettings, task, family, n_layers, d_model, n_heads, d_ff, dropout, positions, norm,
                causal_mask, scale, seed, steps, lr, snapshot_steps="") -> LabConfig:
    """The page's fields as a checked LabConfig, or a UserError naming the field and its range."""
    if not isinstance(task, str) or task not in engine.TASKS:
        raise UserError(f"Unknown task {task!r}; the tasks are {', '.join(engine.TASKS)}.")
    if not isinstance(family, str) or family not in FAMILIES:
        raise UserError(lab_family_reason(family))
    check_choice("Positions", positions, POSITIONS)
    check_choice("Norm", norm, NORMS)
    ints = {name: check_range(label, value, *LIMITS[name]) for name, label, value in (
        ("n_layers", "Layers", n_layers), ("d_model", "d_model", d_model), ("n_heads", "Heads", n_heads),
        ("d_ff", "d_ff", d_ff), ("seed", "Seed", seed))}
    steps = check_range("Steps", steps, 1, settings.max_steps)
    config = LabConfig(
        task=task, family=family, dropout=check_float("Dropout", dropout, 0.0, 0.5),
        positions=None if positions == "default" else positions, norm=None if norm == "default" else norm,
        causal_mask=bool(causal_mask), scale=bool(scale), steps=steps, lr=check_float("lr", lr, 1e-5, 0.1),
        warmup=min(100, max(1, steps // 6)), eval_every=max(5, steps // 10), eval_examples=settings.eval_examples,
        time_budget=settings.max_seconds, snapshot_steps=parse_steps_list(snapshot_steps, steps), **ints)
    return checked(config)


def default_config(settings: LabSettings) -> LabConfig:
    """The run the Lab tab trains when its fields are left as they open."""
    return make_config(settings, **DEFAULT_FIELDS, snapshot_steps=DEFAULT_SNAPSHOT_STEPS)


def checked(config: LabConfig) -> LabConfig:
    try:
        config.check()
    except ValueError as exc:  # the engine's message names the field and what would be right
        raise UserError(f"{str(exc)[:1].upper()}{str(exc)[1:]}.") from None
    return config


def describe(config: LabConfig) -> str:
    """'marian 2×128, 4 heads, d_ff 256, lr 0.001, seed 0', then each switch the config sets itself."""
    heads = f"{config.n_heads} head{'s' if config.n_heads > 1 else ''}"
    text = (f"{config.family} {config.n_layers}×{config.d_model}, {heads}, d_ff {config.d_ff}, lr {config.lr:g}, "
            f"seed {config.seed}")
    positions = "no positions" if config.positions == "none" else f"{config.positions} positions"
    extras = [positions if config.positions else "", f"{config.norm}-LN" if config.norm else "",
              "no causal mask" if not config.causal_mask else "", "no 1/√d_k" if not config.scale else "",
              f"dropout {config.dropout:g}" if config.dropout else ""]
    return ", ".join([text] + [e for e in extras if e])


# ---------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class Experiment:
    label: str  # shown in the page's dropdown
    names: tuple[str, str]  # run A (the switch on), run B (the switch off)


EXPERIMENTS = {
    "causal_mask": Experiment("causal mask: on vs off (decoder only)", ("causal mask", "no causal mask")),
    "positions": Experiment("positions: the family's own vs none", ("positions", "no positions")),
    "scale": Experiment("1/√d_k: on vs off, at d_k = d_model (one head)", ("1/√d_k", "no 1/√d_k")),
    "norm": Experiment("Pre-LN vs Post-LN at lr 0.003 or higher", ("Pre-LN", "Post-LN")),
}
HIGH_LR = 3e-3  # the norm comparison's learning rate, at least


def experiment_pair(config: LabConfig, experiment: str) -> tuple[LabConfig, LabConfig, str]:
    """The two configs of a comparison, identical but for one switch, and a note of what was changed from the
    page's config to make the comparison meaningful."""
    if not isinstance(experiment, str) or experiment not in EXPERIMENTS:
        raise UserError(f"Unknown comparison {experiment!r}; choose one of {', '.join(EXPERIMENTS)}.")
    note = ""
    if experiment == "causal_mask":
        if config.family != "llama":
            config, note = replace(config, family="llama"), "decoder only (the Llama layout), where the mask matters"
        a, b = replace(config, causal_mask=True), replace(config, causal_mask=False)
    elif experiment == "positions":
        own = config.positions if config.positions not in (None, "none") else None
        a, b = replace(config, positions=own), replace(config, positions="none")
    elif experiment == "scale":
        if config.n_heads != 1:
            config, note = replace(config, n_heads=1), f"one head, so d_k = d_model = {config.d_model}"
        a, b = replace(config, scale=True), replace(config, scale=False)
    else:
        if config.lr < HIGH_LR:
            config, note = replace(config, lr=HIGH_LR), f"lr raised to {HIGH_LR:g}"
        a, b = replace(config, norm="pre"), replace(config, norm="post")
    return checked(a), checked(b), note


@dataclass
class Summary:
    """A run's measured numbers, for the results table and the sentences of a comparison."""

    steps: int
    train_loss: float  # mean of the last ten steps' training loss
    early_loss: float  # mean over the first tenth of the steps
    held_loss: float | None
    exact_match: float | None
    initial_entropy: float | None  # mean over layers of the decoder's self-attention entropy before training
    uniform_entropy: float | None  # what the same rows would have if attention were uniform
    tokens_per_s: float
    seconds: float
    stopped_early: bool


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _num(x: float | None, digits: int = 2) -> str:
    """Fixed decimals, but two significant digits below 0.1, so that 0.0002 does not print as 0.00."""
    if x is None:
        return "–"
    if not math.isfinite(x):
        return "NaN"
    return f"{x:.{digits}f}" if abs(x) >= 0.1 or x == 0 else f"{x:.2g}"


def finding(experiment: str, a: Summary, b: Summary, config_a: LabConfig, shares: dict | None = None) -> str:
    """One or two sentences built from the two runs' measured numbers; a conclusion is added only where the
    numbers show it, with its reason where one is measured (shares: ui/services/lab/residual.py's, for a Pre-LN run
    that trained worse), and always the caveat that this is one seed on one task."""
    if experiment == "causal_mask":
        text = (f"Without the causal mask the training loss fell to {_num(b.train_loss)} "
                f"(masked: {_num(a.train_loss)}) {'but' if _lt(b.exact_match, a.exact_match) else 'and'} free-running "
                f"exact match is {_pct(b.exact_match)} (masked: {_pct(a.exact_match)})")
        if _lt(b.train_loss, a.train_loss) and _lt(b.exact_match, a.exact_match):
            text += ": the decoder learned to read the answer it is asked to predict."
        else:
            text += "."
    elif experiment == "positions":
        kind = f"{config_a.positions} positions" if config_a.positions else "the family's own positions"
        text = (f"On {config_a.task}, exact match without positions is {_pct(b.exact_match)} (with {kind}: "
                f"{_pct(a.exact_match)}); final training loss {_num(b.train_loss)} vs {_num(a.train_loss)}.")
        if a.exact_match is not None and b.exact_match is not None:
            gap = a.exact_match - b.exact_match
            if gap >= 0.2:
                text += " Without knowing where a character sits, this model could not do the task."
            elif abs(gap) < 0.1:
                text += " The two are within 10 points: this task was solved without knowing where a character sits."
    elif experiment == "scale":
        d_k = config_a.d_model // config_a.n_heads
        text = (f"At d_k = {d_k}, attention entropy at initialisation is {_num(b.initial_entropy)} nats without "
                f"1/√d_k (with: {_num(a.initial_entropy)}; uniform: {_num(a.uniform_entropy)}), and the mean "
                f"training loss over the first tenth of the steps is {_num(b.early_loss)} "
                f"(with: {_num(a.early_loss)}).")
        if _lt(b.initial_entropy, a.initial_entropy):
            text += " Unscaled scores start larger, so the softmax starts peakier."
        text += f" Final exact match: {_pct(b.exact_match)} without, {_pct(a.exact_match)} with."
    else:
        text = (f"At lr {config_a.lr:g}, Post-LN ended with training loss {_num(b.train_loss)} and exact match "
                f"{_pct(b.exact_match)}; Pre-LN with {_num(a.train_loss)} and {_pct(a.exact_match)}.")
        if not math.isfinite(b.train_loss) or (a.train_loss > 0 and b.train_loss > 2 * a.train_loss):
            text += " Post-LN trained clearly worse at this learning rate."
        elif not math.isfinite(a.train_loss) or (b.train_loss > 0 and a.train_loss > 2 * b.train_loss):
            text += " Here Pre-LN trained clearly worse."
            if shares is not None and config_a.embed_scale:
                text += (f" Why, as the course's block lesson measures it: before training, this Pre-LN model's first "
                         f"attention output is {shares['with']:.1f} % of the residual it joins, whose token "
                         f"embeddings are scaled by √d (d = {shares['d_model']}), against {shares['without']:.1f} % "
                         "without that scale; Pre-LN adds every update to that residual as it is, so the first "
                         "updates hardly move it, while Post-LN normalises after each sum.")
    for name, s in zip(EXPERIMENTS[experiment].names, (a, b)):
        if s.stopped_early:
            text += f" ({name} stopped at step {s.steps}.)"
    return text + (f" One seed ({config_a.seed}) on one task ({config_a.task}): another seed or task can come out "
                   "otherwise.")


def _finite(x: float | None) -> float | None:
    """JSON has no NaN: a diverged loss travels as null (the status line says NaN)."""
    return x if x is not None and math.isfinite(x) else None


def _lt(x: float | None, y: float | None) -> bool:
    return x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and x < y
