"""Positions past the trained length (core/lab/extrapolation.py): a short-budget run of every kind, the learned table
refusing past its rows, whole copies equal to what greedy decoding writes, stopping, saving, and the result the
repository ships (assets/extrapolation), which docs/core.md and the Lab's first screen show."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from core.lab import extrapolation as ex
from core.lab import train as lab_engine

ROOT = Path(__file__).resolve().parents[2]
SHORT = ex.ExtrapolationConfig(steps=12, test_examples=6, test_lengths=(12, 24, 48))


@pytest.fixture(scope="module")
def short_run():
    return ex.run_all(SHORT)


def test_every_kind_trains_and_the_learned_table_refuses_past_its_rows(short_run):
    assert [k.kind for k in short_run.kinds] == list(ex.KINDS) and not short_run.stopped
    for k in short_run.kinds:
        assert k.steps == SHORT.steps
        readable = (12,) if k.kind == "learned" else (12, 24, 48)
        assert sorted(k.accuracy) == list(readable) and sorted(k.exact) == list(readable)
        assert all(0 <= k.exact[n] <= k.accuracy[n] <= 1 for n in readable)
        assert len(k.by_index) == (0 if k.kind == "learned" else 48 + 1)   # 48 symbols, then <eos>
        side = ex.sequence_length(k.attention_symbols)
        assert k.attention.shape == (side, side) and len(k.tokens) == side
        np.testing.assert_allclose(k.attention.sum(1), 1, atol=1e-5)        # rows of a softmax
        assert np.triu(k.attention, 1).max() == 0                           # causal: no later key
        layer, head = k.head
        assert 0 <= layer < SHORT.n_layers and 0 <= head < SHORT.n_heads
    learned = short_run.kind("learned")
    assert learned.attention_symbols == 12 and sorted(learned.refused) == [24, 48]
    assert "no position 28 in the table: it has 27 rows" in learned.refused[24]
    assert "51 positions" in learned.refused[24] and "99 positions" in learned.refused[48]
    assert all(not k.refused for k in short_run.kinds if k.kind != "learned")


def test_the_learned_table_has_one_row_per_position_of_the_longest_training_text():
    model = lab_engine.build_model(SHORT.lab("learned"))
    assert model.stack.embed.positions.weight.shape[0] == ex.sequence_length(SHORT.train_longest) == 27
    assert lab_engine.build_model(SHORT.lab("rope")).stack.embed.positions is None
    # the others are given room for the longest test, and only the positions differ between kinds
    configs = {kind: lab_engine.model_config(SHORT.lab(kind)) for kind in ex.KINDS}
    assert configs["alibi"].score_bias == "alibi" and configs["relative"].score_bias == "relative"
    assert {c.positional for c in configs.values()} == {"sinusoidal", "learned", "rope", "none"}
    same = {k: v for k, v in vars(configs["rope"]).items() if k not in ("positional", "score_bias", "max_positions")}
    for config in configs.values():
        assert {k: v for k, v in vars(config).items() if k in same} == same


def test_whole_copies_are_what_greedy_decoding_writes():
    # a model half way through learning to copy: some texts whole, some not, so the equality can fail
    config = ex.ExtrapolationConfig(kinds=("rope",), steps=150, train_longest=3, test_lengths=(3,), lr=3e-3,
                                    n_layers=2)
    run = None
    for run, _ in lab_engine.train(config.lab("rope")):
        pass
    pairs = lab_engine.examples(ex.TASK, 0, 60, True, (3, 3))
    right, wanted, _ = ex.scored(run.model, pairs)
    whole = (right | ~wanted).all(1)
    prompts = torch.tensor([[lab_engine.BOS, *lab_engine.encode(s), lab_engine.SEP] for s, _ in pairs])
    with torch.inference_mode():
        written = run.model.generate(prompts, 4)[:, prompts.shape[1]:]
    greedy = torch.tensor([lab_engine.decode(row.tolist()) == t and lab_engine.EOS in row.tolist()
                           for row, (_, t) in zip(written, pairs)])
    assert 0 < int(whole.sum()) < len(pairs), "the test needs a model that copies some texts and not others"
    assert torch.equal(whole, greedy)


def test_a_stop_keeps_the_kinds_already_done():
    config = ex.ExtrapolationConfig(kinds=("none", "alibi"), steps=5, test_examples=4)
    seen = []

    def progress(kind, step, steps):
        seen.append((kind, step))

    done = list(ex.extrapolation(config, stop=lambda: any(k == "alibi" and s >= 2 for k, s in seen),
                                 progress=progress))
    assert [k.kind for k in done] == ["none"]          # alibi stopped half-way: no result for it
    assert ("alibi", 2) in seen and ("alibi", 3) not in seen


def test_saving_and_loading_keep_every_number(short_run, tmp_path):
    back = ex.load(ex.save(short_run, tmp_path / "result"))
    assert back.config == short_run.config and back.date == short_run.date and back.threads == short_run.threads > 0
    for a, b in zip(short_run.kinds, back.kinds):
        assert (a.kind, a.accuracy, a.exact, a.copy_weight, a.refused, a.head, a.by_index, a.tokens) == \
            (b.kind, b.accuracy, b.exact, b.copy_weight, b.refused, b.head, b.by_index, b.tokens)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-3)      # float16 on disk


@pytest.mark.parametrize("change, words", [(dict(kinds=("rope", "spiral")), "kinds must be"),
                                           (dict(kinds=()), "kinds must be"),
                                           (dict(kinds=("rope", "rope")), "kinds must be"),
                                           (dict(train_longest=0), "train_longest"),
                                           (dict(test_lengths=(12, 500)), "test lengths"),
                                           (dict(steps=0), "steps")])
def test_bad_configs_are_named(change, words):
    with pytest.raises(ValueError, match=words):
        ex.ExtrapolationConfig(**change).check()


def test_the_shipped_result_is_the_default_run():
    """assets/extrapolation holds what `python -m core.lab.extrapolation --threads 1 --out assets/extrapolation` printed:
    the default config on one thread, all six kinds, each copying the trained length, and the table in docs/core.md
    ("Positions past the trained length") has its numbers."""
    result = ex.load(ROOT / "assets" / "extrapolation")
    assert result.config == ex.ExtrapolationConfig() and not result.stopped and result.threads == 1
    assert [k.kind for k in result.kinds] == list(ex.KINDS)
    for k in result.kinds:
        assert k.accuracy[12] >= 0.9, (k.kind, k.accuracy)       # each learned the task it was trained on
    assert sorted(result.kind("learned").refused) == [24, 48]
    doc = (ROOT / "docs" / "core.md").read_text(encoding="utf-8")
    for k in result.kinds:
        row = re.search(rf"^\| {k.kind} \|(.*)$", doc, re.M)
        assert row, f"docs/core.md has no row for {k.kind}"
        cells = [c.strip() for c in row.group(1).split("|")]
        for n, cell in zip(result.config.test_lengths, cells):
            assert cell == (f"{100 * k.accuracy[n]:.0f} %" if n in k.accuracy else "no row"), (k.kind, n, cell)
    raw = json.loads((ROOT / "assets" / "extrapolation" / "result.json").read_text(encoding="utf-8"))
    assert raw["date"] in doc
