"""The course's lesson on what attention does not tell you: on one IOI prompt, which heads put the most weight on
the answer's earlier mention, beside which heads carry the answer when patched (core.analysis.patching
patch_sweep, each head's output at every position) and which write it directly (logit_attribution), with the rank
correlation between them over every head; and how far the cheapest estimate of that patching (AtP,
core.analysis.shortcuts) ranks the same heads."""

from __future__ import annotations

import torch

from core.analysis import patching, shortcuts
from core.corpus.stats import spearman
from ui.services import patching as patch_service
from ui.services.checks import UserError
from ui.services.learn import Lesson, Measured, ProgressFn, Question

IOI_CLEAN, IOI_CORRUPTED = patch_service.PRESETS["IOI: who gets the drink"]
ANSWER, FOIL = " Mary", " John"   # the indirect object the clean prompt asks for; the subject the corrupted one does
SAME, DIFFERENT = "Yes: the same head", "No: a different head"
TOP_HEADS = 5
SHORTCUT_K = 10      # the top-k overlap's k, the shortcut report's default


def head_name(index: int, n_heads: int) -> str:
    return f"L{index // n_heads} H{index % n_heads}"


def ranked(values: torch.Tensor, k: int = TOP_HEADS) -> list[tuple[str, float]]:
    """The k largest entries of a [layers, heads] map as ("L3 H2", value), largest first."""
    top = values.flatten().topk(min(k, values.numel()))
    return [(head_name(int(i), values.shape[1]), float(v)) for v, i in zip(top.values, top.indices)]


def not_measured(reason: str) -> Measured:
    """A model this lesson cannot read: the reason in words, as the answer, the alt line and the note."""
    return Measured(answer="not measured on this model", answer_text=reason,
                    why="Patching and logit attribution explain a next-token prediction through the logits of two "
                        "tokens, so they need a decoder that predicts the next token.",
                    alt=f"Nothing to draw: {reason}", link={"tab": "patching"}, note=reason)


def weights_on(model, ids: torch.Tensor, position: int) -> torch.Tensor:
    """[layers, heads]: each head's attention from the last token to `position`, from one recorded pass."""
    with torch.inference_mode():
        out = model(ids.to(model.device), record={"pattern"}, return_logits=False)
    return torch.stack([p[0, :, -1, position].float().cpu() for p in out.records["pattern"]])


def measure_not_explanations(model, progress: ProgressFn | None = None) -> Measured:
    """Attention on the answer's earlier mention against the head patching sweep and direct logit attribution,
    over every head, on the IOI pair."""
    reason = patch_service.patching_reason(model)
    if reason:
        return not_measured(reason)
    try:
        pair = patch_service.prepare_pair(model, IOI_CLEAN, IOI_CORRUPTED, ANSWER, FOIL)
    except UserError as error:
        return not_measured(f"This lesson reads the IOI prompt with “{ANSWER.strip()}” and “{FOIL.strip()}” as "
                            f"one token each, and this model's tokenizer cannot: {error}")
    clean, corrupted = pair.ids
    if pair.answer not in pair.clean.ids:
        return not_measured(f"This model's tokenizer writes “{ANSWER.strip()}” inside the prompt as another token "
                            "than the answer, so no token of the prompt is the answer's earlier mention.")
    position = pair.clean.ids.index(pair.answer)        # the answer's earlier mention: where a name mover looks
    attention = weights_on(model, clean, position)      # [L, H]

    def report(done: int, total: int) -> None:
        if progress is not None:
            progress(0.9 * done / max(total, 1), f"patching each head: {done} of {total}")

    try:
        with patch_service.refusals_in_words():
            sweep = patching.patch_sweep(model, clean.to(model.device), corrupted.to(model.device), pair.answer,
                                         pair.foil, "z", "denoise", progress=report)
    except UserError as error:   # e.g. both runs give the same logit difference, so nothing can be restored
        return not_measured(str(error))
    scores = sweep.scores.float().cpu()                 # [L, H] fraction of logit(answer) − logit(foil) restored
    attribution = None
    if patch_service.attribution_reason(model) is None:
        attribution = patch_service.logit_parts(model, pair).heads.float()   # [L, H]
    shortcut = atp_against(model, clean, corrupted, pair, sweep)
    if progress is not None:
        progress(1.0, "done")
    return read_out(pair, position, attention, scores, attribution, sweep, shortcut)


def atp_against(model, clean: torch.Tensor, corrupted: torch.Tensor, pair, sweep) -> tuple[shortcuts.Agreement, int]:
    """(agreement, k): AtP of every head (one forward and one backward pass) against the exact sweep, over the
    heads whose output differs between the two prompts, with the top-k overlap's k, as the Patching tab's
    comparison measures it."""
    estimate = shortcuts.approximate_sweep(model, clean.to(model.device), corrupted.to(model.device), pair.answer,
                                           pair.foil, "z", "denoise", "atp")
    cells = shortcuts.changed_cells(model, clean, corrupted, "z")
    k = min(SHORTCUT_K, int(cells.sum()))
    return shortcuts.compare(sweep.scores.cpu(), estimate.scores.cpu(), True, k, cells), k


def read_out(pair, position: int, attention: torch.Tensor, scores: torch.Tensor, attribution, sweep,
             shortcut: tuple[shortcuts.Agreement, int]) -> Measured:
    n_heads = attention.shape[1]
    atp, k = shortcut
    rho = spearman(attention, scores)
    rho_attribution = None if attribution is None else spearman(attention, attribution)
    looked, carried = int(attention.flatten().argmax()), int(scores.flatten().argmax())
    name_looked, name_carried = head_name(looked, n_heads), head_name(carried, n_heads)
    word = f"“{pair.pieces[0].strip()}”"
    answer = SAME if looked == carried else DIFFERENT
    flat_att, flat_scores = attention.flatten(), scores.flatten()
    answer_text = (
        f"{answer.split(':')[0]}: {name_looked} puts the most weight from the last token on {word} "
        f"({flat_att[looked]:.2f}), and patching its output into the corrupted run restores "
        f"{flat_scores[looked]:.2f} of logit({pair.pieces[0]}) − logit({pair.pieces[1]}); "
        + ("it is also the head that restores most." if looked == carried else
           f"the head that restores most is {name_carried} ({flat_scores[carried]:.2f}), whose weight there is "
           f"{flat_att[carried]:.2f}.")
        + f" Over all {attention.numel()} heads, Spearman's ρ between the attention on {word} and the patching "
          f"score is {rho:.2f}"
        + ("." if rho_attribution is None else f", and {rho_attribution:.2f} with each head's direct logit "
                                               "attribution.")
        + f" AtP, the cheap estimate of the same patching from one backward pass, ranks the heads with ρ = "
          f"{atp.rho:.2f} against it and finds {round(atp.overlap * k)} of its {k} strongest heads in its own top "
          f"{k}.")
    if attribution is None:
        why = (f"A weight says where a head reads, not what reaches the answer: the patching sweep restores "
               f"{flat_scores[carried]:.2f} through {name_carried}, whose weight on {word} is only "
               f"{flat_att[carried]:.2f}.")
    else:
        flat_dla = attribution.flatten()
        writer = int(flat_dla.argmax())
        why = (f"A weight says where a head reads, not what it writes: {name_looked} adds {flat_dla[looked]:.2f} "
               f"to the logit difference directly, while {head_name(writer, n_heads)} adds "
               f"{flat_dla[writer]:.2f}, the most of any head (weight on {word}: {flat_att[writer]:.2f}).")
    values = {
        "attention": attention.numpy(), "patching": scores.numpy(),
        "attribution": None if attribution is None else attribution.numpy(),
        "rho": rho, "rho_attribution": rho_attribution, "position": position, "word": word,
        "top": {"attention": ranked(attention), "patching": ranked(scores),
                "attribution": None if attribution is None else ranked(attribution)},
        "clean_metric": sweep.clean_metric, "corrupted_metric": sweep.corrupted_metric,
        "answer_id": pair.answer, "foil_id": pair.foil,
        "atp": {"rho": atp.rho, "overlap": atp.overlap, "k": k, "missed": len(atp.false_negatives)},
    }
    return Measured(
        answer=answer, answer_text=answer_text, why=why,
        alt=(f"Each of the {attention.numel()} heads: its attention on {word} against its patching score; "
             f"Spearman's ρ = {rho:.2f}; most attention {name_looked}, most restored {name_carried}."),
        values=values, link={"tab": "patching", "text": IOI_CLEAN, "corrupted": IOI_CORRUPTED,
                             "settings": {"site": "z"}, "show": "patch-map"})


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="not-explanations",
        title="What attention does not tell you",
        text=(
            "An attention map is tempting to read as an explanation: the head looked at this token, so this token "
            "is why. But a weight only says that a query matched a key. What the head then copies (its values "
            "through W^O, eq. 3.1) may be small, may be cancelled later, or may not reach the answer at all.\n\n"
            "Two measurements ask the question directly, on the same prompt. **Activation patching** runs a "
            "corrupted prompt (“Mary gave a drink to”) with one head's output taken from the clean run (“John "
            "gave a drink to”) and measures how much of logit(Mary) − logit(John) comes back. **Direct logit "
            "attribution** splits that difference into each head's own part. Here every head's attention from "
            "the last token to “Mary” is set beside both, and Spearman's ρ says whether their rankings agree."),
        question=Question(prompt="On “When Mary and John went to the store, John gave a drink to”, is the head "
                                 "that puts the most attention on “Mary” also the head whose patching restores the "
                                 "answer most?", choices=(SAME, DIFFERENT)),
        measure=measure_not_explanations,
        text_sample=f"{IOI_CLEAN} (corrupted: {IOI_CORRUPTED})",
    ),
)
