"""What a trained Lab run answered on a typed source, the task's right answer, and whether its attention looks
where the task says each output character comes from (weight_on_source: the formation number that
bench/lab_snapshots.py follows through the Lab's default run, and the Lab tab's alignment note)."""

from __future__ import annotations

import calendar
import re

import numpy as np

from . import train as engine


def answer_of(maps: engine.LabAttention, source: str) -> str:
    """A decoder-only model's answer: the tokens between <sep> and <eos>."""
    tokens = maps.target_tokens
    start = len(source) + 2
    return "".join(t for t in tokens[start:] if t not in engine.SPECIALS)


def expected_answer(task: str, source: str) -> str | None:
    """The task's right answer for a typed source, when the source is one the task could have made."""
    if task == "copy":
        return source
    if task == "reverse":
        return source[::-1]
    if task == "sort":
        return "".join(sorted(source))
    if task == "add" and (m := re.fullmatch(r"(\d+)\+(\d+)", source)):
        return str(int(m[1]) + int(m[2]))
    if task == "dates" and (m := re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", source)):
        year, month, day = int(m[1]), int(m[2]), int(m[3])
        if 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]:
            return f"{day} {calendar.month_name[month]} {year}"
    return None


def source_positions(task: str, source: str, target: str) -> tuple[list[set[int] | None], str] | None:
    """Where the task says each output character comes from: per character of `target`, a set of source positions
    (None for a character no position gives, such as a date's spaces), and those positions in words; None for a
    task whose characters come from no one position (sort, add)."""
    if task in ("reverse", "copy"):
        where = [{len(source) - 1 - i if task == "reverse" else i} for i in range(len(target))]
        what = "the mirrored source position (the anti-diagonal)" if task == "reverse" else "the same source position"
        return where, what
    if task == "dates" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", source):
        fields = [set(range(8, 10)), set(range(5, 7)), set(range(0, 4))]  # day, month, year in YYYY-MM-DD
        words = [target[:i].count(" ") for i in range(len(target))]
        return [None if c == " " or w > 2 else fields[w] for c, w in zip(target, words)], \
            "their own source field (day, month or year)"
    return None


def alignment_note(task: str, source: str, maps: engine.LabAttention) -> str:
    """Per layer, how many output characters' cross-attention (mean of heads) peaks where the task says the
    character comes from: the mirror position for reverse, the same position for copy, its field for dates."""
    if maps.cross is None:
        return ""
    expected = source_positions(task, source, "".join(maps.target_tokens[1:]))
    if expected is None:
        return ""
    where, what = expected
    counted = [i for i, w in enumerate(where) if w is not None]
    if not counted:
        return ""
    # row i of the cross-attention is the decoder position that predicts output character i
    shares = [sum(int(peaks[i]) in where[i] for i in counted)
              for peaks in maps.cross.mean(1).argmax(-1)]  # [L, T]: each row's peak source position
    per_layer = ", ".join(f"layer {layer}: {hits} of {len(counted)}" for layer, hits in enumerate(shares))
    return f"Output characters whose cross-attention (mean of heads) peaks on {what}: {per_layer}."


def weight_on_source(task: str, source: str, maps: engine.LabAttention) -> np.ndarray | None:
    """How formed the attention is, per layer [L]: the weight (mean of heads) that the rows predicting the output
    characters give the source positions the task says each comes from, averaged over those characters. 1: they
    look only there; about 1 / len(source): they look everywhere alike. Cross-attention for an encoder-decoder,
    the decoder's self-attention over <bos> source <sep> target otherwise; None where the task names no position."""
    if maps.cross is not None:
        target = "".join(maps.target_tokens[1:])
        attention, first_row, first_key = maps.cross, 0, 0  # row i predicts output character i
    else:
        target = answer_of(maps, source)
        attention, first_row, first_key = maps.decoder, len(source) + 1, 1  # <sep> predicts the first character
    expected = source_positions(task, source, target)
    counted = [] if expected is None else [(i, w) for i, w in enumerate(expected[0])
                                           if w is not None and all(0 <= j < len(source) for j in w)]
    if not counted:
        return None
    mean = attention.float().mean(1).numpy()  # [L, queries, keys]
    per_char = [mean[:, first_row + i, [first_key + j for j in sorted(w)]].sum(-1) for i, w in counted]
    return np.mean(per_char, axis=0)
