"""The training lab's engine: tasks, a loss that falls, the same curve from the same seed, the causal mask's leak
measured, saved models that round-trip through the core and through transformers, and clear errors."""
import pytest
import torch

from core import load_model
from core.lab import train as lab

SMALL = dict(d_model=64, n_heads=4, d_ff=128, eval_examples=40)


def run(steps, **kw):
    config = lab.LabConfig(steps=steps, eval_every=steps, **{**SMALL, **kw})
    for result, _ in lab.train(config):
        pass
    return result


def test_tasks_are_right_and_the_held_out_split_is_disjoint():
    for source, target in lab.examples("reverse", 0, 50, False, (8, 12)):
        assert target == source[::-1] and 8 <= len(source) <= 12 and not lab.held_out(source)
    assert all(t == "".join(sorted(s)) for s, t in lab.examples("sort", 1, 20, True, (8, 12)))
    assert all(int(t) == sum(map(int, s.split("+"))) for s, t in lab.examples("add", 2, 20, False, (8, 12)))
    dates = lab.examples("dates", 3, 20, True, (8, 12))
    assert all(lab.held_out(s) for s, _ in dates)
    assert all(t.split()[0] == str(int(s[8:])) and t.split()[2] == s[:4] for s, t in dates)
    assert lab.decode(lab.encode("2026-11-29") + [lab.EOS, 5]) == "2026-11-29"


def test_decoder_only_batches_take_the_loss_on_the_target_only():
    batch = lab.make_batch([("abc", "cba")], seq2seq=False)
    ids, labels = batch.inputs["input_ids"][0], batch.labels[0]
    assert ids.tolist() == [lab.BOS] + lab.encode("abc") + [lab.SEP] + lab.encode("cba") + [lab.EOS]
    assert labels.tolist() == [-100] * 4 + lab.encode("cba") + [lab.EOS] + [-100]


@pytest.mark.parametrize("family", ["marian", "llama"])
def test_loss_falls_and_the_same_seed_gives_the_same_curve(family):
    first, second = run(40, family=family), run(40, family=family)
    losses = [p.train_loss for p in first.history]
    assert losses == [p.train_loss for p in second.history]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert first.final.exact_match is not None and first.final.held_loss < losses[0]


def test_without_the_causal_mask_the_decoder_learns_to_copy_and_cannot_generate():
    kw = dict(family="llama", task="copy", lengths=(4, 6), lr=3e-3, warmup=20)
    masked, leaky = run(200, **kw), run(200, causal_mask=False, **kw)
    assert leaky.history[-1].train_loss < 0.5 * masked.history[-1].train_loss
    assert leaky.final.exact_match < masked.final.exact_match


@pytest.mark.parametrize("family,switch", [("marian", {}), ("llama", {}), ("marian", {"norm": "pre"}),
                                           ("llama", {"positions": "none", "scale": False})])
def test_a_saved_model_round_trips(tmp_path, family, switch):
    result = run(5, family=family, **switch)
    folder = lab.save(result, tmp_path / "model")
    batch = lab.make_batch(lab.examples("reverse", 0, 4, True, (8, 12)), family == "marian")
    result.model.eval()
    ours = result.model(**batch.inputs).logits
    assert torch.equal(load_model(folder, device="cpu")(**batch.inputs).logits, ours)
    if not lab.standard(result.lab):
        return  # transformers' class for the family cannot compute this variant; the core reads it back
    transformers = pytest.importorskip("transformers")
    cls = transformers.MarianMTModel if family == "marian" else transformers.LlamaForCausalLM
    with torch.no_grad():
        theirs = cls.from_pretrained(folder).eval()(**batch.inputs).logits
    real = batch.inputs["attention_mask"].bool() if family == "llama" else slice(None)  # padded rows differ
    assert (ours - theirs)[real].abs().max() <= 1e-5
    assert transformers.AutoTokenizer.from_pretrained(folder)("ab").input_ids == lab.encode("ab")


@pytest.mark.parametrize("bad,message", [
    (dict(d_model=64, n_heads=5), "multiple of n_heads"), (dict(d_ff=0), "d_ff must be"),
    (dict(task="poetry"), "unknown task 'poetry'"), (dict(family="gpt"), "family must be"),
    (dict(positions="spiral"), "positions must be"), (dict(positions="alibi"), "family 'llama' only"),
    (dict(lr=float("nan")), "lr must be"), (dict(attention_only=True), "attention-only model is a decoder")])
def test_bad_configs_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        next(lab.train(lab.LabConfig(**bad)))


def test_command_line(tmp_path, capsys):
    assert lab.main(["--task", "copy", "--steps", "4", "--eval-every", "2", "--d-model", "32", "--heads", "2",
                     "--d-ff", "64", "--out", str(tmp_path / "m")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step     2") and "exact match" in lines[0] and lines[-1].startswith("saved to")
    assert (tmp_path / "m" / "model.safetensors").is_file()
    assert lab.main(["--heads", "3"]) == 2
    assert "multiple of n_heads" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["marian", "llama"])
def test_snapshots_and_attention_maps_of_a_lab_model(family):
    result = run(6, family=family, snapshot_steps=(2, 6))
    assert sorted(result.snapshots) == [2, 6] and len(result.initial_entropy) == 2
    maps = lab.lab_attention(result.model, family, "abcd", "dcba")
    for m in (maps.decoder, maps.encoder, maps.cross):
        if m is not None:
            torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))
    if family == "marian":
        assert maps.cross.shape == (2, 4, 5, 5) and maps.encoder.shape == (2, 4, 5, 5)  # abcd<eos>, <bos>dcba
        assert maps.source_tokens[-1] == "<eos>" and maps.target_tokens[0] == "<bos>"
        assert 0 <= lab.alignment(maps, lambda i: 3 - i) <= 1
    else:
        assert maps.cross is None and maps.decoder.shape[-1] == 11   # <bos> abcd <sep> dcba <eos>
        assert torch.equal(maps.decoder, maps.decoder.tril()), "the decoder's attention stays causal"
    with pytest.raises(ValueError, match="outside the lab's vocabulary"):
        lab.lab_attention(result.model, family, "abc!")


@pytest.mark.slow
def test_a_run_stopped_at_once_still_comes_back_and_step_zero_is_a_snapshot():
    config = lab.LabConfig(steps=5, snapshot_steps=(0,), **SMALL)
    results = list(lab.train(config, stop=lambda: True))
    assert len(results) == 1 and results[0][0].stopped and results[0][1].step == 0
    assert results[0][0].final.exact_match is not None and 0 in results[0][0].snapshots
    for bad, message in ((dict(eval_every=0), "eval_every must be"), (dict(lengths=(5, 3)), "lengths must be"),
                         (dict(snapshot_steps=(9,)), "snapshot steps must lie")):
        with pytest.raises(ValueError, match=message):
            lab.LabConfig(steps=5, **bad).check()
    with pytest.raises(ValueError, match="1 to 20 characters"):
        lab.lab_attention(run(2, family="llama").model, "llama", "a" * 21)


def test_an_attention_only_run_adds_nothing_but_attention_and_saves_as_a_standard_llama(tmp_path):
    """The MLPs keep their place (d_ff 1) with output weights zero and frozen: after training they still write
    exactly 0, and transformers' Llama reads the folder and gives the same logits."""
    result = run(20, family="llama", task="copy-62", attention_only=True, d_model=32)
    for block in result.model.stack.blocks:
        assert block.ffn.down.weight.shape == (32, 1) and not block.ffn.down.weight.any()
        assert not any(p.requires_grad for p in block.ffn.parameters())
    ids = torch.tensor([[lab.BOS, *lab.encode("a7Qz"), lab.SEP, *lab.encode("a7Qz")]])
    out = result.model(ids, record={"mlp_out"})
    assert len(out.records["mlp_out"]) == 2 and all(not v.any() for v in out.records["mlp_out"])
    folder = lab.save(result, tmp_path / "m")
    assert lab.main(["--task", "copy-62", "--family", "llama", "--attention-only", "--lengths", "8", "20", "--steps",
                     "2", "--eval-every", "2", "--d-model", "32", "--heads", "4"]) == 0
    transformers = pytest.importorskip("transformers")
    with torch.no_grad():
        theirs = transformers.LlamaForCausalLM.from_pretrained(folder).eval()(ids).logits
    assert (theirs - result.model(ids).logits).abs().max() <= 1e-5
