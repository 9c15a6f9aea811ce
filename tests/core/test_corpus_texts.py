"""The corpora: IOI pairs well formed on SmolLM2's tokenizer and answered by the model, induction texts that repeat,
and a user's corpus from .txt/.jsonl/.csv, each bad upload refused with a message naming its line."""
import json

import pytest
import torch

from core.analysis.heads import induction_probe
from core.corpus import Pair
from core.corpus import texts as corpus


@pytest.fixture(scope="module")
def tok(smollm_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm_folder)


class CharTokenizer:
    """One token per character: no name is one token after a space."""
    all_special_ids: list[int] = []

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def test_ioi_pairs_are_well_formed(tok):
    pairs = corpus.ioi_pairs(tok, 40, seed=3)
    assert len(pairs) == 40
    assert len({tok.decode(p.clean) for p in pairs}) > 30   # drawn, not one prompt repeated
    for p in pairs:
        assert p.clean.dtype == p.corrupted.dtype == torch.long and p.clean.ndim == 1
        assert p.clean.shape == p.corrupted.shape
        assert p.answer != p.foil
        for token in (p.answer, p.foil):
            piece = tok.decode([token])
            assert piece.startswith(" ") and piece.strip() in corpus.IOI_NAMES
            assert tok(piece, add_special_tokens=False)["input_ids"] == [token]
        clean = p.clean.tolist()
        # the subject twice and the indirect object once; the corrupted prompt swaps the second subject mention
        assert clean.count(p.foil) == 2 and clean.count(p.answer) == 1
        second = [i for i, t in enumerate(clean) if t == p.foil][1]
        differ = (p.clean != p.corrupted).nonzero().flatten().tolist()
        assert differ == [second] and p.corrupted[second].item() == p.answer
        assert clean == tok(tok.decode(p.clean))["input_ids"]   # encoded as the app encodes the text (no BOS here)


def test_ioi_pairs_are_deterministic_from_the_seed(tok):
    same = corpus.ioi_pairs(tok, 8, seed=1), corpus.ioi_pairs(tok, 8, seed=1)
    assert all(torch.equal(a.clean, b.clean) and a.answer == b.answer for a, b in zip(*same))
    other = corpus.ioi_pairs(tok, 8, seed=2)
    assert [p.clean.tolist() for p in same[0]] != [p.clean.tolist() for p in other]


def test_ioi_pairs_say_when_too_few_words_are_one_token():
    with pytest.raises(ValueError, match=r"too few single-token words.*0 of \d+ names"):
        corpus.ioi_pairs(CharTokenizer(), 5)


def test_smollm_prefers_the_indirect_object_on_average(smollm):
    pairs = corpus.ioi_pairs(smollm.tokenizer, 20, seed=0)
    lengths = torch.tensor([len(p.clean) for p in pairs])
    ids = torch.zeros(len(pairs), int(lengths.max()), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(pairs):
        ids[i, :len(p.clean)], mask[i, :len(p.clean)] = p.clean, 1
    with torch.inference_mode():   # one batched forward, padded on the right; logits at each prompt's last token
        hidden = smollm(ids, attention_mask=mask, return_logits=False).hidden_states
        logits = smollm.logits(hidden[torch.arange(len(pairs)), lengths - 1]).float()
    answer = logits.gather(1, torch.tensor([[p.answer] for p in pairs]))[:, 0]
    foil = logits.gather(1, torch.tensor([[p.foil] for p in pairs]))[:, 0]
    assert (answer - foil).mean() > 0


def test_induction_texts_repeat_exactly(tok):
    texts = corpus.induction_texts(tok, 4, 25, seed=7)
    special = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
    for i, ids in enumerate(texts):
        assert ids.shape == (1 + 2 * 25,) and ids[0] == tok.bos_token_id
        assert torch.equal(ids[1:26], ids[26:])
        assert not special & set(ids[1:].tolist()) and int(ids.max()) < tok.vocab_size
        assert torch.equal(ids, induction_probe(tok.vocab_size, 25, 7 + i, tok.bos_token_id, tuple(special))[0])
    assert not torch.equal(texts[0], texts[1])
    bare = corpus.induction_texts(tok, 1, 10, bos=None)[0]
    assert bare.shape == (20,) and torch.equal(bare[:10], bare[10:])


def test_encode_texts_encodes_as_the_app_does_and_refuses_an_empty_text(tok):
    strings = ["The keeper lit the lamp.", "When Mary and John went to the store"]
    texts = corpus.encode_texts(tok, strings)
    assert [t.tolist() for t in texts] == [tok(s)["input_ids"] for s in strings]
    with pytest.raises(ValueError, match="text 1 is empty"):
        corpus.encode_texts(tok, ["fine", "  "])


# ---- a user's corpus

TEXTS = ["The keeper lit the lamp at dusk.", "A second text, with a comma.", "Third: \"quoted\" words."]
PAIR = {"clean": "When Mary and John went to the store, John gave a drink to",
        "corrupted": "When Mary and John went to the store, Mary gave a drink to", "answer": " Mary", "foil": " John"}


def write(folder, name, content):
    path = folder / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def csv_text(header, rows):
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def test_good_files_of_each_kind_give_the_same_texts(tmp_path, tok):
    files = [write(tmp_path, "lines.txt", "\n".join(TEXTS) + "\n"),
             write(tmp_path, "blocks.txt", "\n\n".join(TEXTS) + "\n\n\n"),
             write(tmp_path, "t.jsonl", "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS))),
             write(tmp_path, "t.csv", csv_text(["id", "text"], list(enumerate(TEXTS))))]
    for path in files:
        assert corpus.read_texts(path, tok) == TEXTS, path.name
    # blank-line separated blocks keep their lines
    path = write(tmp_path, "para.txt", "one line\nand its second\n\n  \nnext text\n")
    assert corpus.read_texts(path) == ["one line\nand its second", "next text"]


def test_lines_are_numbered_as_an_editor_numbers_them(tmp_path):
    # a raw U+2028 inside a JSON string and Windows line ends: neither moves the line a message names
    raw = json.dumps({"text": "one\u2028line"}, ensure_ascii=False)
    path = write(tmp_path, "sep.jsonl", (raw + "\r\n" + raw + "\r\n{}\r\n").encode("utf-8"))
    with pytest.raises(ValueError, match="line 3: no 'text' field"):
        corpus.read_texts(path)
    path = write(tmp_path, "crlf.txt", "first\r\nsecond\r\n".encode("utf-8"))
    assert corpus.read_texts(path) == ["first", "second"]


def test_good_pair_files_give_the_same_pairs(tmp_path, tok):
    other = {key: value.replace("drink", "ring") for key, value in PAIR.items()}
    jsonl = write(tmp_path, "p.jsonl", "".join(json.dumps(r) + "\n" for r in (PAIR, other)))
    table = write(tmp_path, "p.csv", csv_text(list(PAIR), [list(PAIR.values()), list(other.values())]))
    from_jsonl, from_csv = corpus.read_pairs(jsonl, tok), corpus.read_pairs(table, tok)
    mary, john = (tok(w, add_special_tokens=False)["input_ids"][0] for w in (" Mary", " John"))
    for a, b in zip(from_jsonl, from_csv):
        assert isinstance(a, Pair) and torch.equal(a.clean, b.clean) and torch.equal(a.corrupted, b.corrupted)
        assert (a.answer, a.foil) == (b.answer, b.foil) == (mary, john)
    assert from_jsonl[0].clean.tolist() == tok(PAIR["clean"])["input_ids"]


LONG = " ".join(["word"] * 40)
BAD_TEXTS = [  # (file name, content, keywords, what the message must contain)
    ("latin1.txt", "first\nsecond caf\xe9\n".encode("latin-1"), {}, ["line 2", "not UTF-8"]),
    ("broken.jsonl", '{"text": "fine"}\n{"text": "no end"\n', {}, ["line 2", "not valid JSON"]),
    ("list.jsonl", '{"text": "fine"}\n["a list"]\n', {}, ["line 2", "JSON list"]),
    ("nofield.jsonl", '{"text": "fine"}\n\n{"body": "elsewhere"}\n', {}, ["line 3", "no 'text' field", "'body'"]),
    ("empty.jsonl", '{"text": "fine"}\n{"text": "   "}\n', {}, ["line 2", "'text' is empty"]),
    ("number.jsonl", '{"text": 12}\n', {}, ["line 1", "'text' is a int"]),
    ("nocolumn.csv", "body\nsome text\n", {}, ["line 1", "no text column", "'body'"]),
    ("emptycell.csv", "id,text\n1,fine\n2,\n", {}, ["line 3", "'text' is empty"]),
    ("shortrow.csv", "id,text\n1,fine\n2\n", {}, ["line 3", "no value for 'text'"]),
    ("many.txt", "a\nb\nc\nd\n", {"max_items": 3}, ["line 4", "more than 3 items", "MAX_ITEMS"]),
    ("manyblocks.txt", "a\n\nb\n\nc\nc2\n", {"max_items": 2}, ["line 5", "more than 2 items"]),
    ("long.txt", f"short\n{LONG}\n", {"max_tokens": 20}, ["line 2", "40 tokens", "MAX_TOKENS_PER_ITEM"]),
    # the size is checked before the encoding (these bytes are not UTF-8)
    ("big.txt", b"\xff" * 64, {"max_bytes": 10}, ["big.txt is 64 bytes; the limit is 10 bytes", "MAX_BYTES = 5.00 MB"]),
    ("corpus.tsv", "a\tb\n", {}, [".txt, .jsonl, .csv", ".tsv"]),
]


@pytest.mark.parametrize("name,content,limits,words", BAD_TEXTS, ids=[b[0] for b in BAD_TEXTS])
def test_a_bad_text_corpus_is_refused_naming_the_line(tmp_path, tok, name, content, limits, words):
    with pytest.raises(ValueError) as caught:
        corpus.read_texts(write(tmp_path, name, content), tok, **limits)
    for word in words:
        assert word in str(caught.value)


def pair_line(**changes):
    return json.dumps(dict(PAIR, **changes)) + "\n"


BAD_PAIRS = [
    ("answer.jsonl", pair_line() + pair_line(answer=" Marylebone"), {},
     ["line 2", "'answer' ' Marylebone' is", "one token"]),
    ("foil.jsonl", pair_line(foil=" Johnathanson"), {}, ["line 1", "'foil'", "one token"]),
    ("nofoil.jsonl", pair_line() + json.dumps({k: v for k, v in PAIR.items() if k != "foil"}) + "\n", {},
     ["line 2", "'foil'", "clean, corrupted, answer, foil"]),
    ("unequal.jsonl", pair_line() + pair_line(corrupted=PAIR["corrupted"].replace("the store", "the big store")),
     {}, ["line 2", "the clean prompt is 14 tokens and the corrupted one 15"]),
    ("emptyclean.jsonl", pair_line(clean=""), {}, ["line 1", "'clean' is empty"]),
    ("emptyanswer.csv", csv_text(list(PAIR), [list(PAIR.values()), [PAIR["clean"], PAIR["corrupted"], "", " John"]]),
     {}, ["line 3", "'answer' is empty"]),
    ("nocolumn.csv", csv_text(["clean", "corrupted", "answer"], [list(PAIR.values())[:3]]), {},
     ["line 1", "no foil column"]),
    ("many.jsonl", pair_line() * 3, {"max_items": 2}, ["line 3", "more than 2 items"]),
    ("long.jsonl", pair_line(), {"max_tokens": 10}, ["line 1", "the clean prompt is 14 tokens", "MAX_TOKENS_PER_ITEM"]),
    ("pairs.txt", "clean\tcorrupted\n", {}, [".jsonl or .csv"]),
    ("pairs.json", "{}", {}, [".txt, .jsonl, .csv", ".json"]),
]


@pytest.mark.parametrize("name,content,limits,words", BAD_PAIRS, ids=[b[0] for b in BAD_PAIRS])
def test_a_bad_pair_corpus_is_refused_naming_the_line(tmp_path, tok, name, content, limits, words):
    with pytest.raises(ValueError) as caught:
        corpus.read_pairs(write(tmp_path, name, content), tok, **limits)
    for word in words:
        assert word in str(caught.value)
