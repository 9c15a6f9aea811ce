"""What carries the answer, as plain values over core.analysis.patching: a clean and a corrupted prompt checked
and encoded whole (a prompt over the limit is refused, never cut: the prediction explained is always the
prompt's own), the answer and foil tokens (typed, or the runs' top tokens), the patching sweep streamed with its
progress, direct logit attribution, and the information-flow graph, kept server-wide in the KeptStore under a
session's ticket so a new threshold only re-prunes it, and how good the shortcuts are: the exact sweep against each
cheap estimate of it (core.analysis.shortcuts: AtP, AtP*, EAP-IG, the flow graph) on the same pair, checked by the
same prepare_pair. The core's refusals of its input come back as UserError."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from core.analysis import patching, qk, shortcuts
from core.corpus import Pair
from ui.services.checks import UserError, check_choice, check_float, check_range
from ui.services.heads import next_token_reason
from ui.services.jobs import JobUpdate, stream_job
from ui.services.kept import KeptStore, new_ticket
from ui.services.text import Encoded, as_batch, encode, one_token, token_pieces, token_texts, valid_unicode

MAX_PATCH_TOKENS = 64   # a residual sweep patches layers × tokens cells (1,920 for SmolLM2 at 64 tokens)
MAX_FLOW_TOKENS = 64    # the flow graph holds layers × heads × tokens² importances
DEFAULT_THRESHOLD = 0.04
IOI_PRESET = "IOI: who gets the drink"  # the preset whose kind of pair the built-in IOI corpus varies
PRESETS = {  # name → (clean, corrupted): the answer is the clean run's top token, the foil the corrupted run's
    IOI_PRESET: ("When Mary and John went to the store, John gave a drink to",
                 "When Mary and John went to the store, Mary gave a drink to"),
    "Fact: which city": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of"),
    "Induction: a repeated phrase": ("The keeper lit the lamp at dusk. The keeper lit the",
                                     "The farmer fed the goats at noon. The keeper lit the"),
}
SITES = {  # the API's site name → (core site, by position at one layer)
    "resid_pre": ("resid_pre", False),
    "attn_out": ("attn_out", False),
    "mlp_out": ("mlp_out", False),
    "z": ("z", False),
    "z_by_position": ("z", True),
}


def patching_reason(model) -> str | None:
    """Why this model cannot be patched here, or None when it can (the Heads tab's check, with this tab's advice)."""
    return next_token_reason(model, "Patching", advice="Choose a decoder model (e.g. smollm2-135m-instruct).")


def attribution_reason(model) -> str | None:
    """Why direct logit attribution and the flow graph cannot read this model, or None."""
    reason = patching_reason(model)
    if reason is None:
        try:
            patching.check_pre_norm(model, "Each of logit attribution and the flow graph")
        except ValueError as error:
            reason = sentence(str(error))
    return reason


class TokenMismatch(UserError):
    """The two prompts have different token counts; `rows` lists them side by side."""

    def __init__(self, text: str, rows: list[list]):
        super().__init__(text)
        self.rows = rows


@dataclass
class PatchPair:
    clean: Encoded
    corrupted: Encoded | None   # None: attribution without a corrupted prompt (the foil is then the clean run's)
    answer: int
    foil: int
    chosen: str          # how the answer and foil were chosen, in words
    pieces: tuple[str, str]   # the answer's and the foil's own text (a leading space kept)

    @property
    def ids(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return as_batch(self.clean.ids), None if self.corrupted is None else as_batch(self.corrupted.ids)


@contextmanager
def refusals_in_words():
    """The core's refusals of its input (ValueError, IndexError: equal metrics, a token id or layer out of range)
    as a UserError, whose words reach the page."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, IndexError) as error:
        raise UserError(sentence(str(error))) from error


def sentence(text: str) -> str:
    text = text.strip() or "The input was refused"
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "?", "!")) else ".")


def is_empty(text) -> bool:
    return text is None or (isinstance(text, str) and not text.strip())


def token_count(model, text) -> int:
    """How many tokens the whole text is (with the tokenizer's own special tokens), nothing cut."""
    if is_empty(text):
        return 0
    return len(model.tokenizer(valid_unicode(text))["input_ids"])


def limit_of(model, limit: int) -> int:
    return min(limit, model.config.max_positions)


def check_lengths(model, what: str, limit: int, clean_text, corrupted_text=None) -> None:
    """A UserError naming the limit and each prompt's token count when one is over it: cutting would change
    the prediction explained (the end) or drop the token the tokenizer adds first (the start)."""
    limit = limit_of(model, limit)
    counts = [token_count(model, clean_text)] + ([] if corrupted_text is None else [token_count(model, corrupted_text)])
    if max(counts) <= limit:
        return
    have = f"the clean prompt has {counts[0]:,} tokens" + (f" and the corrupted one {counts[1]:,}" if counts[1:] else "")
    raise UserError(f"{what} reads prompts of at most {limit} tokens, and {have}. Shorten "
                    f"{'them' if counts[1:] else 'it'} to {limit} tokens or fewer: cutting would explain a prediction "
                    "other than the prompt's own.")


def encode_whole(model, text, limit: int) -> Encoded:
    """The prompt's tokens, all of them (check_lengths has refused a longer one)."""
    return encode(model, text, limit_of(model, limit))


def side_by_side(model, clean: Encoded, corrupted: Encoded) -> list[list]:
    """[position, clean token, corrupted token] rows, '' where one prompt has no token."""
    a, b = token_texts(model, clean.ids), token_texts(model, corrupted.ids)
    return [[i, a[i] if i < len(a) else "", b[i] if i < len(b) else ""] for i in range(max(len(a), len(b)))]


def top_tokens(model, ids: list[int], k: int = 2) -> list[int]:
    with torch.inference_mode():  # the last position's logits only
        hidden = model(as_batch(ids, model.device), return_logits=False).hidden_states
        logits = model.logits(hidden[:, -1])[0]
    return logits.topk(k).indices.tolist()


def prepare_pair(model, clean_text, corrupted_text, answer_text, foil_text, what: str = "Patching",
                 corrupted_needed: bool = True) -> PatchPair:
    """Both prompts encoded whole (the same token count, at most MAX_PATCH_TOKENS), and the answer and foil ids.
    Without corrupted_needed an empty corrupted prompt is allowed: the foil is then the clean run's most likely
    token after the answer."""
    reason = patching_reason(model)
    if reason:
        raise UserError(reason)
    if is_empty(clean_text):
        raise UserError("The clean prompt is empty: type the prompt whose next token is explained.")
    without = is_empty(corrupted_text)
    if without and corrupted_needed:
        raise UserError("The corrupted prompt is empty: type the clean prompt with the detail that matters changed.")
    check_lengths(model, what, MAX_PATCH_TOKENS, clean_text, None if without else corrupted_text)
    clean = encode_whole(model, clean_text, MAX_PATCH_TOKENS)
    if without:
        return choose_tokens(model, clean, None, answer_text, foil_text)
    corrupted = encode_whole(model, corrupted_text, MAX_PATCH_TOKENS)
    if len(clean.ids) != len(corrupted.ids):
        raise TokenMismatch(
            f"The two prompts must have the same number of tokens, position for position, and the clean one has "
            f"{len(clean.ids)} while the corrupted one has {len(corrupted.ids)}. Change a word for one of the same "
            "token count (the tokens are listed side by side).", side_by_side(model, clean, corrupted))
    return choose_tokens(model, clean, corrupted, answer_text, foil_text)


def choose_tokens(model, clean: Encoded, corrupted: Encoded | None, answer_text, foil_text) -> PatchPair:
    """The answer (typed, or the clean run's top token) and the foil (typed, or the corrupted run's top token;
    without a corrupted prompt, the clean run's most likely token after the answer)."""
    answer = one_token(model, "Answer", answer_text, "to use the clean run's top token")
    foil_source = "the clean run's second most likely token" if corrupted is None else "the corrupted run's top token"
    foil = one_token(model, "Foil", foil_text, f"to use {foil_source}")
    chosen = []
    if answer is None:
        answer = top_tokens(model, clean.ids, 1)[0]
        chosen.append("the answer is the clean run's top token")
    if foil is None and corrupted is None:
        ranked = top_tokens(model, clean.ids)
        foil = ranked[1] if ranked[0] == answer else ranked[0]
        chosen.append("there is no corrupted prompt, so the foil is the clean run's "
                      + ("second most likely token" if ranked[0] == answer else "most likely token"))
    elif foil is None:
        ranked = top_tokens(model, corrupted.ids)
        foil = ranked[1] if ranked[0] == answer else ranked[0]
        chosen.append("the foil is the corrupted run's top token" + (" after the answer" if ranked[0] == answer else ""))
    if answer == foil:
        raise UserError("The answer and the foil are the same token, so their logit difference is always 0: choose "
                        "two different tokens (or leave the foil empty).")
    return PatchPair(clean, corrupted, answer, foil, "; ".join(chosen), tuple(token_pieces(model, [answer, foil])))


def check_site(name) -> tuple[str, bool]:
    return SITES[check_choice("Site", name, SITES)]


def check_mode(name) -> str:
    if not isinstance(name, str) or name not in patching.MODES:
        raise UserError(f"Mode must be 'denoise' or 'noise', got {str(name)[:40]!r}.")
    return name


def sweep_shape(model, site: str, by_position: bool, n_tokens: int) -> tuple[int, int]:
    cfg = model.config
    if site == "z":
        return (cfg.n_heads, n_tokens) if by_position else (cfg.n_layers, cfg.n_heads)
    return cfg.n_layers, n_tokens


def check_differ(pair: PatchPair) -> None:
    if pair.clean.ids == pair.corrupted.ids:
        raise UserError(f"The clean and corrupted prompts are the same {len(pair.clean.ids)} tokens, so every patch "
                        "writes what is already there: change the detail that matters in the corrupted prompt.")


@dataclass(frozen=True)
class SweepSettings:
    site: str               # the core's site
    by_position: bool       # one layer's heads × positions
    mode: str
    layer: int | None       # the layer of a by-position sweep


def check_sweep(model, site_name, mode, layer) -> SweepSettings:
    """The sweep's settings checked, each error naming its field."""
    site, by_position = check_site(site_name)
    mode = check_mode(mode)
    chosen = check_range("Layer", layer, 0, model.config.n_layers - 1) if by_position else None
    return SweepSettings(site, by_position, mode, chosen)


def stream_patching(model, pair: PatchPair, settings: SweepSettings) -> Iterator[JobUpdate]:
    """The sweep in a worker thread, an update after each batch and then the core's PatchSweep as the result.
    The core's refusals (equal metrics on both runs) are raised as UserError by the iterator."""
    site, by_position, mode, chosen = settings.site, settings.by_position, settings.mode, settings.layer
    check_differ(pair)
    clean, corrupted = pair.ids
    total = sweep_shape(model, site, by_position, len(pair.clean.ids))
    work = lambda report: patching.patch_sweep(  # noqa: E731
        model, clean.to(model.device), corrupted.to(model.device), pair.answer, pair.foil, site, mode, chosen,
        progress=report)
    return updates_in_words(stream_job(work, total[0] * total[1], "patch-sweep"))


def updates_in_words(updates: Iterator[JobUpdate]) -> Iterator[JobUpdate]:
    """The job's updates; closing this closes the job (yield from passes the close on)."""
    with refusals_in_words():
        yield from updates


def logit_parts(model, pair: PatchPair) -> patching.LogitAttribution:
    """Direct logit attribution of logit(answer) − logit(foil) on the clean prompt's last position."""
    reason = attribution_reason(model)
    if reason:
        raise UserError(reason)
    with refusals_in_words():
        return patching.logit_attribution(model, pair.ids[0].to(model.device), pair.answer, pair.foil)


def check_threshold(value) -> float:
    return check_float("Threshold", value, 0.0, 1.0)


def flow(model, tokens: Encoded, threshold) -> patching.FlowGraph:
    """The information-flow graph of the last token's prediction, pruned at `threshold`."""
    reason = attribution_reason(model)
    if reason:
        raise UserError(reason)
    with refusals_in_words():
        return patching.flow_graph(model, as_batch(tokens.ids, model.device), -1, check_threshold(threshold))


def encode_flow(model, text) -> Encoded:
    """The flow graph's prompt, whole, or a UserError naming the limit and its token count."""
    if is_empty(text):
        raise UserError("The clean prompt is empty: type the prompt whose next token is explained.")
    check_lengths(model, "The flow graph", MAX_FLOW_TOKENS, text)
    return encode_whole(model, text, MAX_FLOW_TOKENS)


@dataclass(frozen=True)
class FlowCache:
    """What a session keeps between flow graphs: which prompt its graph was of and the ticket it is kept under
    in the server-wide KeptStore. A few hundred bytes: the graph's [L, H, T, T] parts are in the store."""
    key: tuple      # (model name, the prompt's token ids)
    ticket: str


@dataclass
class FlowResult:
    graph: patching.FlowGraph
    tokens: Encoded
    seconds: float | None   # None: re-pruned from the kept graph, no pass
    cache: FlowCache


def graph_bytes(graph: patching.FlowGraph) -> int:
    """The kept graph's real size: its tensors (the edges are re-pruned on every call)."""
    return sum(t.nbytes for t in (graph.heads, graph.attn_residual, graph.mlp, graph.mlp_residual))


def kept_flow(model, model_name: str, text, threshold, kept: KeptStore, previous=None) -> FlowResult:
    """The flow graph of the prompt's prediction at `threshold`: re-pruned from the graph kept under the
    session's ticket when it is of the same model and prompt, else computed (one pass) and kept."""
    threshold = check_threshold(threshold)
    tokens = encode_flow(model, text)
    key = (model_name, tuple(tokens.ids))
    ticket = previous.ticket if isinstance(previous, FlowCache) else new_ticket()
    found = kept.get(ticket, key) if isinstance(previous, FlowCache) else None
    if found is not None:
        with refusals_in_words():
            return FlowResult(found.pruned(threshold), tokens, None, FlowCache(key, ticket))
    started = time.perf_counter()
    graph = flow(model, tokens, threshold)
    seconds = time.perf_counter() - started
    kept.put(ticket, key, graph, graph_bytes(graph))
    return FlowResult(graph, tokens, seconds, FlowCache(key, ticket))


EDGE_HEADS = 3   # an edge's heads whose reasons are shown, strongest first (the flow graph's parts)


def edge_reasons(model, model_name: str, text, threshold, layer, target, source, kept: KeptStore,
                 previous=None) -> tuple[FlowResult, qk.EdgeAttribution]:
    """Why a kept attention edge source → target through `layer` of the prompt's flow graph at `threshold` is
    there (core qk.edge_attribution: each of its heads' relative score split into the components that wrote its
    query and its key), on the graph kept for the session or computed (kept_flow). An edge the graph does not
    keep is refused, naming the ones it keeps there."""
    result = kept_flow(model, model_name, text, threshold, kept, previous)
    n = len(result.tokens.ids)
    layer = check_range("Edge layer", layer, 0, result.graph.n_layers - 1)
    target = check_range("Edge target (the later token)", target, 0, n - 1)
    source = check_range("Edge source (the token read)", source, 0, target)
    with refusals_in_words():
        found = qk.edge_attribution(model, as_batch(result.tokens.ids, model.device), result.graph, layer, target,
                                    source)
    return result, found


# ---- how good are the shortcuts ----

SHORTCUT_SITES = {  # the site name → what it is, in words
    "z": "each head's output (layer × head)",
    "resid_pre": "the residual stream entering each layer (layer × position)",
}
SITE_METHODS = {"z": shortcuts.METHODS, "resid_pre": ("atp", "atp*", "ig")}  # the flow graph has no resid_pre part
METHOD_WORDS = {
    "atp": "AtP (attribution patching: the activation difference times the metric's gradient)",
    "atp*": "AtP* (AtP with the query/key fix; not the paper's second fix, for effects that cancel)",
    "ig": f"EAP-IG (the gradient averaged over {shortcuts.IG_POINTS} points between the two prompts)",
    "flow": "the flow graph's importance (a proximity: no causal claim)",
}
K = 10   # the top-k compared
STRONG = shortcuts.STRONG   # a strong cell's exact effect: this share of clean − corrupted or more


def check_shortcut_site(name) -> str:
    return check_choice("Site", name, SHORTCUT_SITES)


def check_shortcut_method(name, site: str) -> str:
    return check_choice("Method", name, SITE_METHODS[site],
                        hint="(the flow graph has no part for resid_pre)" if site == "resid_pre" else "")


def cell_names(site: str, shape: tuple[int, int], tokens: list[str]) -> list[str]:
    """Each cell's name, row-major over the sweep's [rows, cols]: "L3 H5" for a head, "L2 pos 4 'token'" for a
    residual cell."""
    rows, cols = shape
    if site == "z":
        return [f"L{r} H{c}" for r in range(rows) for c in range(cols)]
    return [f"L{r} pos {c} {tokens[c]!r}" for r in range(rows) for c in range(cols)]


@dataclass
class MethodAgreement:
    method: str
    estimates: np.ndarray       # [N] the method's value on each compared cell
    rho: float                  # Spearman's ρ (against |exact| for the unsigned flow graph)
    overlap: float              # the share of the exact top k in the method's top k
    false_negatives: list[str]  # cells with |exact| ≥ STRONG the method ranks below k
    signed_error: float         # mean method − exact on the strongest cells (NaN: unsigned)
    cost: float                 # forward-pass equivalents on this pair
    signed: bool


@dataclass
class PairShortcuts:
    """The exact sweep and each method on the compared cells (those whose activation differs between the two
    prompts) of one pair."""
    site: str
    mode: str
    k: int
    names: list[str]            # [N] the compared cells' names
    exact: np.ndarray           # [N] the exact normalised scores
    exact_cost: float           # the exact sweep's forward-pass equivalents
    strong: int                 # cells with |exact| ≥ STRONG
    clean_metric: float
    corrupted_metric: float
    methods: list[MethodAgreement]
    cells: int                  # every cell of the sweep (the compared ones are a part)


def as_core_pair(pair: PatchPair) -> Pair:
    clean, corrupted = pair.ids
    return Pair(clean[0], corrupted[0], pair.answer, pair.foil)


def pair_shortcuts(model, pair: PatchPair, site_name, mode, k: int = K) -> PairShortcuts:
    """Exact patching and every method the site has (SITE_METHODS), compared on this pair by shortcut_report."""
    site, mode = check_shortcut_site(site_name), check_mode(mode)
    check_differ(pair)
    methods = SITE_METHODS[site]
    with refusals_in_words():
        report = shortcuts.shortcut_report(model, [as_core_pair(pair)], site, methods, k, mode)
    if report.left_out:
        raise UserError(next(iter(report.left_out.values())).capitalize().rstrip(".") + ".")
    truth, cells, found = report.exact[0], report.cells[0], report.per_pair[0]
    chosen = cells.flatten().numpy()
    names = [n for n, keep in zip(cell_names(site, tuple(truth.scores.shape), token_texts(model, pair.clean.ids)),
                                  chosen) if keep]
    exact = truth.scores.flatten().numpy()[chosen]
    width = truth.scores.shape[-1]
    rows = []
    for method in methods:
        agreement, estimate = found[method], report.estimates[0][method]
        rows.append(MethodAgreement(
            method, estimate.scores.flatten().numpy()[chosen], agreement.rho, agreement.overlap,
            [names[index_of(chosen, r * width + c)] for r, c in agreement.false_negatives],
            agreement.signed_error, agreement.cost, method in shortcuts.SIGNED))
    return PairShortcuts(site, mode, min(k, int(chosen.sum())), names, exact, float(report.exact_cost.mean),
                         int(report.strong.mean), truth.clean_metric, truth.corrupted_metric, rows,
                         truth.scores.numel())


def index_of(chosen: np.ndarray, flat: int) -> int:
    """The place among the compared cells of the sweep's flat cell `flat`."""
    return int(chosen[:flat].sum())


def one_estimate(model, pair: PatchPair, site_name, mode, method) -> shortcuts.ApproximateSweep:
    """One method's map of the whole sweep (approximate_sweep), the exact sweep's shape and normalisation."""
    site, mode = check_shortcut_site(site_name), check_mode(mode)
    method = check_shortcut_method(method, site)
    check_differ(pair)
    clean, corrupted = (ids.to(model.device) for ids in pair.ids)
    with refusals_in_words():
        return shortcuts.approximate_sweep(model, clean, corrupted, pair.answer, pair.foil, site, mode, method)
