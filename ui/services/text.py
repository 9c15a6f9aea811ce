"""Text in, tokens out: uploads, the one size cap, Unicode that tokenizers can read, token ids with labels.

The cap on typed and uploaded text is a setting (AppSettings.text_cap_bytes); the functions take it as an
argument, with the default setting's value as the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ui.services.checks import UserError
from ui.settings import DEFAULT_TEXT_BYTES, TEXT_CAP_SETTING

UPLOAD_SUFFIXES = (".txt", ".md")
@dataclass
class Encoded:
    ids: list[int]
    labels: list[str]  # unique per position: "12 the"
    special: list[bool]  # True for BOS/EOS/[CLS]/chat markers
    note: str = ""  # e.g. the truncation message


def read_upload(path: str | Path | None, cap: int = DEFAULT_TEXT_BYTES) -> str:
    """The text of an uploaded .txt/.md file, or a UserError saying what is wrong with it."""
    if path is None:
        raise UserError("No file was uploaded.")
    path = Path(path)
    if path.suffix.lower() not in UPLOAD_SUFFIXES:
        raise UserError(
            f"{path.name}: only .txt and .md files can be read, not {path.suffix or 'files without a suffix'}."
        )
    size = path.stat().st_size
    if size > cap:
        raise UserError(text_cap_message(path.name, size, cap))
    if size == 0:
        raise UserError(f"{path.name} is empty.")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path.name} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); save it "
            "as UTF-8 and upload it again."
        ) from exc
    if not text.strip():
        raise UserError(f"{path.name} holds only whitespace.")
    return text


def text_cap_message(what: str, size: int, cap: int = DEFAULT_TEXT_BYTES) -> str:
    return (
        f"{what} is {size / 1e6:.2f} MB; the limit for typed and uploaded text is {cap / 1e6:g} MB. "
        f"On your own machine, start the app with {TEXT_CAP_SETTING} set to more megabytes (e.g. {TEXT_CAP_SETTING}=5) "
        "to raise it."
    )


def check_text_size(label: str, text: str | None, cap: int = DEFAULT_TEXT_BYTES) -> str | None:
    """The text unchanged when its UTF-8 form is within `cap` bytes, else a UserError naming the field."""
    if text is None or len(text) * 4 <= cap:  # a character is at most 4 bytes: no need to count
        return text
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > cap:
        raise UserError(text_cap_message(f"The text in {label!r}", size, cap))
    return text


def display_token(text: str) -> str:
    """A token as it should appear on an axis: visible whitespace, never empty."""
    shown = text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if shown.strip() == "":
        return "␣" * max(1, len(shown))
    return shown.strip() if len(shown) > 1 else shown


def valid_unicode(text: str) -> str:
    """The text with each unpaired surrogate (which JSON can carry but no tokenizer reads) replaced by U+FFFD."""
    if not isinstance(text, str):
        raise UserError(f"The text must be a string, got a {type(text).__name__}.")
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def checked_text(text) -> str:
    """The text as a tokenizer can read it, or a UserError if it is missing, empty or not a string: asked before a
    model is loaded for it."""
    if text is None or (isinstance(text, str) and not text.strip()):
        raise UserError("The text is empty: type or paste some text, or upload a .txt/.md file.")
    return valid_unicode(text)


def encode(model, text: str, max_tokens: int | None = None, add_special_tokens: bool = True) -> Encoded:
    """Token ids of `text`, cut to the model's context (and `max_tokens`) with a note saying how much."""
    text = checked_text(text)
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=add_special_tokens)["input_ids"]
    limit = model.config.max_positions if max_tokens is None else min(max_tokens, model.config.max_positions)
    note = ""
    if len(ids) > limit:
        why = (
            "the model's context"
            if limit == model.config.max_positions
            else f"this view's limit (the model's context is {model.config.max_positions:,})"
        )
        note = (
            f"The text has {len(ids):,} tokens; only the first {limit:,} are used ({why}); "
            f"{len(ids) - limit:,} were dropped."
        )
        ids = ids[:limit]
    if not ids:
        raise UserError("The text gives no tokens.")
    special_ids = set(tok.all_special_ids)
    pieces = [display_token(tok.decode([i])) for i in ids]
    labels = [f"{i} {p}" for i, p in enumerate(pieces)]
    return Encoded(ids=ids, labels=labels, special=[i in special_ids for i in ids], note=note)


def as_batch(ids: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """One sequence as input_ids [1, T] on the model's device."""
    return torch.tensor([ids], dtype=torch.long, device=device)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """float32 numpy from any device and dtype (bfloat16 on a GPU has no numpy type)."""
    return t.detach().float().cpu().numpy()


def token_texts(model, ids) -> list[str]:
    """Each token id as it reads on a page (visible whitespace)."""
    return [display_token(model.tokenizer.decode([int(i)])) for i in ids]


def token_pieces(model, ids) -> list[str]:
    """Each token's own text, spaces and newlines kept, for showing the text as it reads."""
    return [model.tokenizer.decode([int(i)]) for i in ids]


def token_grid(model, ids: np.ndarray) -> list[list[str]]:
    """A 2-D array of token ids as display strings, each distinct id decoded once."""
    distinct = np.unique(ids)
    names = dict(zip(distinct.tolist(), token_texts(model, distinct)))
    return [[names[i] for i in row] for row in ids.tolist()]


def one_token(model, field: str, text: str | None, empty: str) -> int | None:
    """The id of the one token `text` is (typed as it appears in running text, e.g. " Mary" with its space), None
    when the field is empty (`empty` says what that means), or a UserError naming the field and showing how the
    text splits."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise UserError(f"{field} must be text typed as one token, got a {type(text).__name__}.")
    ids = model.tokenizer(valid_unicode(text), add_special_tokens=False)["input_ids"]
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise UserError(f"{field}: {text[:40]!r} gives no token here; type one token, e.g. ' Mary', or leave the "
                        f"field empty {empty}.")
    pieces = token_pieces(model, ids)
    shown = " + ".join(repr(piece) for piece in pieces[:8]) + (f" + … ({len(ids) - 8} more)" if len(ids) > 8 else "")
    raise UserError(
        f"{field} must be one token, and {text[:40]!r} splits into {len(ids)} here: {shown}. Type one of them "
        f"(a leading space is part of a word's token), or leave the field empty {empty}."
    )
