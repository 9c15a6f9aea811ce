"""The corpora the summaries run over: IOI prompt pairs, induction texts, and a user's corpus read from .txt, .jsonl
or .csv with the standard library. Every text is encoded as the app encodes a typed text: the tokenizer's own
special tokens added (so a BOS only where the tokenizer puts one; SmolLM2's puts none), nothing cut."""
from __future__ import annotations

import csv
import io
import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from . import Pair

MAX_ITEMS = 1000                # texts or pairs in one uploaded corpus
MAX_BYTES = 5_000_000           # an uploaded file's size, checked before it is read
MAX_TOKENS_PER_ITEM = 512       # tokens in one text (each prompt of a pair)
SUFFIXES = (".txt", ".jsonl", ".csv")
TEXT_FIELDS = ("text",)
PAIR_FIELDS = ("clean", "corrupted", "answer", "foil")

# ---- IOI in the style of Wang et al. 2022: {A} and {B} are introduced, {S} (one of them) gives, the other is
# the indirect object the model should name next. Each template ends just before that name.
IOI_TEMPLATES = (
    "When {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "While {A} and {B} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} had a lot of fun at the {PLACE}. {S} gave a {OBJECT} to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {S} gave it to",
    "The {PLACE} {A} and {B} went to had a {OBJECT}. {S} gave it to",
)
IOI_NAMES = (
    "Mary", "John", "Tom", "James", "Dan", "Sid", "Martin", "Amy", "Paul", "Kate", "Lisa", "Anna", "Mark", "Sarah",
    "David", "Michael", "Laura", "Jessica", "Emma", "Rachel", "Peter", "George", "Henry", "Alice", "Jack", "Ben",
    "Chris", "Eric", "Adam", "Mike", "Steve", "Brian", "Kevin", "Jason", "Justin", "Ryan", "Andrew", "Robert",
    "Richard", "Charles", "Thomas", "Daniel", "Matthew", "Anthony", "Joseph", "William", "Elizabeth", "Jennifer",
    "Susan", "Karen", "Nancy", "Linda", "Barbara", "Helen", "Emily", "Rose", "Grace", "Lucy", "Sam", "Max",
)
IOI_PLACES = (
    "store", "garden", "restaurant", "school", "hospital", "office", "house", "station", "park", "library",
    "market", "beach", "church", "museum", "bank", "hotel", "party", "zoo",
)
IOI_OBJECTS = (  # consonant-initial, so "a {OBJECT}" reads right
    "drink", "ring", "kiss", "bone", "basketball", "computer", "necklace", "snack", "book", "bag", "gift", "ball",
    "letter", "pen", "cake", "flower", "hat", "key",
)
MIN_NAMES = 2


def ids_of(tokenizer, text: str) -> list[int]:
    """Token ids of a text as the app encodes a typed one: the tokenizer's own special tokens added."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def one_token_id(tokenizer, text: str) -> int | None:
    """The id of the one token `text` is (with its leading space, as in running text), else None."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None


def single_tokens(tokenizer, words: Iterable[str]) -> dict[str, int]:
    """word → id for the words that are one token after a space, in the order given."""
    found = {}
    for word in words:
        token = one_token_id(tokenizer, " " + word)
        if token is not None:
            found[word] = token
    return found


def encode_texts(tokenizer, strings: Iterable[str]) -> list[Tensor]:
    """Each string's token ids, 1-D long tensors, as the app encodes a typed text; an empty one is refused by index."""
    if isinstance(strings, str):
        raise TypeError("encode_texts takes a list of strings, not one string")
    texts = []
    for i, text in enumerate(strings):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"text {i} is empty (or not a string, {type(text).__name__}); every text needs words")
        texts.append(torch.tensor(ids_of(tokenizer, text), dtype=torch.long))
    return texts


def ioi_pairs(tokenizer, n: int, seed: int = 0) -> list[Pair]:
    """`n` IOI pairs drawn from the templates with names, places and objects that are one token for this tokenizer.
    The clean prompt names the subject twice ("When Mary and John went to the store, John gave a drink to"); the
    corrupted one has the second mention replaced by the indirect object ("..., Mary gave a drink to"), as the
    Patching tab's IOI preset does. answer = the indirect object's id, foil = the subject's. Both orders of the
    first two names (ABBA, BABA) are drawn. Deterministic from seed."""
    if n < 1:
        raise ValueError(f"n must be at least 1 pair, got {n}")
    names = single_tokens(tokenizer, IOI_NAMES)
    places, objects = single_tokens(tokenizer, IOI_PLACES), single_tokens(tokenizer, IOI_OBJECTS)
    if len(names) < MIN_NAMES or not places or not objects:
        raise ValueError(
            f"too few single-token words for IOI prompts with this tokenizer: {len(names)} of {len(IOI_NAMES)} names "
            f"(at least {MIN_NAMES} needed), {len(places)} of {len(IOI_PLACES)} places and {len(objects)} of "
            f"{len(IOI_OBJECTS)} objects (at least 1 each) are one token after a space")
    rng = random.Random(seed)
    name_list, place_list, object_list = list(names), list(places), list(objects)
    pairs: list[Pair] = []
    tries = 0
    while len(pairs) < n:
        tries += 1
        if tries > 20 * n:
            raise ValueError(f"only {len(pairs)} of {n} IOI pairs tokenize to equal lengths with this tokenizer "
                             f"after {tries - 1} tries")
        template = rng.choice(IOI_TEMPLATES)
        io, s = rng.sample(name_list, 2)
        a, b = (io, s) if rng.random() < 0.5 else (s, io)
        fill = {"A": a, "B": b, "PLACE": rng.choice(place_list), "OBJECT": rng.choice(object_list)}
        pair = ioi_pair(tokenizer, template.format(S=s, **fill), template.format(S=io, **fill),
                        names[io], names[s])
        if pair is not None:
            pairs.append(pair)
    return pairs


def ioi_pair(tokenizer, clean: str, corrupted: str, answer: int, foil: int) -> Pair | None:
    """The pair when the prompts tokenize to equal lengths differing at one place (the subject's second mention
    in the clean one, the indirect object in the corrupted one), else None: a merge across a word boundary."""
    a, b = ids_of(tokenizer, clean), ids_of(tokenizer, corrupted)
    if len(a) != len(b):
        return None
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    if differ != [(foil, answer)]:
        return None
    return Pair(torch.tensor(a, dtype=torch.long), torch.tensor(b, dtype=torch.long), answer, foil)


def induction_probe(vocab_size: int, length: int = 100, seed: int = 0, bos: int | None = None,
                    avoid: tuple[int, ...] = ()) -> Tensor:
    """A seeded sequence of `length` random tokens repeated twice, [1, 2·length (+1 with BOS)]: the second copy
    is predictable only by looking back at the first."""
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[list(avoid)] = False
    pool = allowed.nonzero().squeeze(-1)
    half = pool[torch.randint(len(pool), (length,), generator=gen)]
    parts = ([torch.tensor([bos])] if bos is not None else []) + [half, half]
    return torch.cat(parts)[None]


def induction_texts(tokenizer, n: int, length: int, seed: int = 0, bos: int | None | str = "tokenizer") -> list[Tensor]:
    """`n` texts of `length` random ordinary tokens (no special or added ones) repeated once, 1-D [2·length (+1)].
    Text i is the Heads tab's induction probe with seed `seed + i`. `bos` is the token put first: by default the
    tokenizer's BOS where it has one; a caller holding the model passes `model.config.bos_token_id` (the probe's
    choice), or None for none."""
    if n < 1 or length < 1:
        raise ValueError(f"n and length must be at least 1, got n={n}, length={length}")
    bos = getattr(tokenizer, "bos_token_id", None) if bos == "tokenizer" else bos
    added = getattr(tokenizer, "get_added_vocab", dict)()
    avoid = tuple(sorted(set(getattr(tokenizer, "all_special_ids", ())) | set(added.values())))
    vocab = tokenizer.vocab_size
    return [induction_probe(vocab, length, seed + i, bos, avoid)[0] for i in range(n)]


# ---- a user's corpus

def read_texts(path, tokenizer=None, *, max_items: int = MAX_ITEMS, max_tokens: int = MAX_TOKENS_PER_ITEM,
               max_bytes: int = MAX_BYTES) -> list[str]:
    """The texts of a .txt, .jsonl or .csv file, each checked (and, given a tokenizer, its token count).

    .txt: one text per line; when the file has a blank (or whitespace-only) line, texts are instead separated by
    blank lines and may span several lines (kept joined by newlines). .jsonl: one JSON object per line with a
    `text` field (blank lines skipped). .csv: a header row with a `text` column, one text per row.
    Each refusal is a ValueError naming the file and the line."""
    path = Path(path)
    content = read_checked(path, max_bytes)
    if path.suffix.lower() == ".txt":
        items = [(line, {"text": text}) for line, text in txt_items(content)]
    else:
        items = list(records(path, content, TEXT_FIELDS))
    texts = []
    for count, (line, record) in enumerate(items, 1):
        at = f"{path.name}, line {line}"
        check_count(at, count, max_items)
        text = field_text(at, record, "text")
        if tokenizer is not None:
            check_tokens(at, "the text", len(ids_of(tokenizer, text)), max_tokens)
        texts.append(text)
    if not texts:
        raise ValueError(f"{path.name} holds no texts")
    return texts


def read_pairs(path, tokenizer, *, max_items: int = MAX_ITEMS, max_tokens: int = MAX_TOKENS_PER_ITEM,
               max_bytes: int = MAX_BYTES) -> list[Pair]:
    """The prompt pairs of a .jsonl or .csv file with the fields clean, corrupted, answer and foil: the two
    prompts must tokenize to the same count, the answer and foil must each be one token as typed in running text
    (e.g. " Mary", its leading space kept). Each refusal is a ValueError naming the file and the line."""
    path = Path(path)
    if path.suffix.lower() == ".txt":
        raise ValueError(f"{path.name}: pairs need the named fields {', '.join(PAIR_FIELDS)}, which a .txt file "
                         "cannot hold; upload them as .jsonl or .csv")
    content = read_checked(path, max_bytes)
    pairs = []
    for count, (line, record) in enumerate(records(path, content, PAIR_FIELDS), 1):
        at = f"{path.name}, line {line}"
        check_count(at, count, max_items)
        clean, corrupted = (field_text(at, record, name) for name in ("clean", "corrupted"))
        answer, foil = (field_token(at, record, name, tokenizer) for name in ("answer", "foil"))
        a, b = ids_of(tokenizer, clean), ids_of(tokenizer, corrupted)
        check_tokens(at, "the clean prompt", len(a), max_tokens)
        check_tokens(at, "the corrupted prompt", len(b), max_tokens)
        if len(a) != len(b):
            raise ValueError(f"{at}: the clean prompt is {len(a)} tokens and the corrupted one {len(b)}; patching "
                             "compares them position by position, so they need the same token count")
        pairs.append(Pair(torch.tensor(a, dtype=torch.long), torch.tensor(b, dtype=torch.long), answer, foil))
    if not pairs:
        raise ValueError(f"{path.name} holds no pairs")
    return pairs


def read_checked(path: Path, max_bytes: int) -> str:
    """The file's text after its suffix, size (before reading) and UTF-8 encoding are checked."""
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"{path.name}: a corpus is read from {', '.join(SUFFIXES)} files, not "
                         f"{path.suffix or 'a file without a suffix'}")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{path.name} is {size_words(size)}; the limit is {size_words(max_bytes)} "
                         f"(MAX_BYTES = {size_words(MAX_BYTES)} unless max_bytes says otherwise); split the corpus "
                         "into smaller files")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ValueError(f"{path.name}, line {line}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); "
                         "save the file as UTF-8 and read it again") from exc


def size_words(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 100_000 else f"{size:,} bytes"


def lines_of(content: str) -> list[str]:
    """The lines as an editor numbers them: split at \n only (str.splitlines also splits at U+2028 and the like,
    which JSON may hold raw inside a string), a trailing \r dropped."""
    lines = [line.removesuffix("\r") for line in content.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def txt_items(content: str) -> Iterator[tuple[int, str]]:
    """(first line, text) per text: one a line, or blank-line separated blocks when the file has a blank line."""
    lines = lines_of(content)
    if all(line.strip() for line in lines):
        yield from ((i, line) for i, line in enumerate(lines, 1))
        return
    start, block = 0, []
    for i, line in enumerate(lines + [""], 1):
        if line.strip():
            start = start or i
            block.append(line)
        elif block:
            yield start, "\n".join(block)
            start, block = 0, []


def records(path: Path, content: str, fields: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """(line, record) per item of a .jsonl or .csv file's content."""
    if path.suffix.lower() == ".jsonl":
        yield from jsonl_records(path.name, content)
    else:
        yield from csv_records(path.name, content, fields)


def jsonl_records(name: str, content: str) -> Iterator[tuple[int, dict]]:
    for i, line in enumerate(lines_of(content), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}, line {i}: not valid JSON ({exc.msg} at column {exc.colno}); each line "
                             "must be one JSON object, e.g. {\"text\": \"...\"}") from exc
        except ValueError:   # JSON's reader refuses an integer past Python's digit limit (4,300) this way
            raise ValueError(f"{name}, line {i}: a number too long to read (thousands of digits); each line must be "
                             "one JSON object, e.g. {\"text\": \"...\"}") from None
        except RecursionError:   # Python's parser gives up about a thousand brackets deep
            raise ValueError(f"{name}, line {i}: JSON nested too deeply to read; each line must be one flat JSON "
                             "object, e.g. {\"text\": \"...\"}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{name}, line {i}: a JSON {type(record).__name__} where a JSON object with named "
                             "fields was expected")
        yield i, record


def csv_records(name: str, content: str, fields: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """(first line, row as a dict) per non-blank row; a cell a short row lacks is None."""
    reader = csv.reader(io.StringIO(content, newline=""))
    try:
        header = next(reader, [])
        missing = [f for f in fields if f not in header]
        if missing:
            raise ValueError(f"{name}, line 1: the header has no {', '.join(missing)} column (it has: "
                             f"{', '.join(repr(h) for h in header) or 'nothing'}); it needs {', '.join(fields)}")
        start = reader.line_num + 1
        for row in reader:
            if any(cell.strip() for cell in row):
                yield start, {key: row[i] if i < len(row) else None for i, key in enumerate(header)}
            start = reader.line_num + 1
    except csv.Error as exc:
        raise ValueError(f"{name}, line {reader.line_num}: not valid CSV ({exc})") from exc


def field_text(at: str, record: dict, field: str) -> str:
    """The record's field as a non-empty string, or a ValueError naming the place and the field."""
    if field not in record:
        has = ", ".join(repr(k) for k in record) or "none"
        raise ValueError(f"{at}: no {field!r} field (the fields here: {has})")
    if record[field] is None:
        raise ValueError(f"{at}: no value for {field!r}")
    value = record[field]
    if not isinstance(value, str):
        raise ValueError(f"{at}: {field!r} is a {type(value).__name__}; it must be text")
    if not value.strip():
        raise ValueError(f"{at}: {field!r} is empty; every item needs text")
    return unicode_text(at, field, value)


def unicode_text(at: str, field: str, value: str) -> str:
    """The value, or a ValueError naming a lone surrogate: JSON's "\\ud800" escape decodes to one, which is half of
    a UTF-16 pair and no character, so no tokenizer can read it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{at}: {field!r} holds a lone surrogate (\\u{ord(value[exc.start]):04x} at character "
                         f"{exc.start + 1}), half of a UTF-16 pair and no character; write the character itself, or "
                         "both halves of its pair") from None
    return value


def field_token(at: str, record: dict, field: str, tokenizer) -> int:
    """The one token id a field is (its spaces kept), or a ValueError showing how it splits."""
    if field not in record or record[field] is None:
        raise ValueError(f"{at}: no {field!r} field or value; a pair needs {', '.join(PAIR_FIELDS)}")
    value = record[field]
    if not isinstance(value, str) or value == "":
        raise ValueError(f"{at}: {field!r} is empty; it must be one token, e.g. ' Mary' with its leading space")
    token = one_token_id(tokenizer, unicode_text(at, field, value))
    if token is None:
        ids = tokenizer(value, add_special_tokens=False)["input_ids"]
        pieces = " + ".join(repr(tokenizer.decode([i])) for i in ids[:8]) or "no token"
        raise ValueError(f"{at}: {field!r} {value[:40]!r} is {len(ids)} tokens ({pieces}); it must be one token, "
                         "e.g. ' Mary' with its leading space")
    return token


def check_count(at: str, count: int, max_items: int) -> None:
    if count > max_items:
        raise ValueError(f"{at}: more than {max_items:,} items (MAX_ITEMS = {MAX_ITEMS:,} unless max_items says "
                         "otherwise); split the corpus into smaller files")


def check_tokens(at: str, what: str, count: int, max_tokens: int) -> None:
    if count > max_tokens:
        raise ValueError(f"{at}: {what} is {count:,} tokens; the limit is {max_tokens:,} tokens per item "
                         f"(MAX_TOKENS_PER_ITEM = {MAX_TOKENS_PER_ITEM:,} unless max_tokens says otherwise); "
                         "shorten it")
