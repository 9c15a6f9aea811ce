"""The small rules of attention, each written once low in the core (core/config.py, core/attention.py,
core/model.py) and read by every module that needs it: query head → KV head, a layer's window and mask, the
rotation of a sliding layer, the soft-cap, and the index check (one rule, one exception type)."""
import re
from pathlib import Path

import pytest
import torch

from core import load_model
from core.attention import layer_mask, position_mask, soft_cap
from core.config import IndexRangeError, ModelConfig, check_index
from tests import tiny

ROOT = Path(__file__).resolve().parents[2]


def config(**changes) -> ModelConfig:
    base = dict(family="llama", n_layers=4, n_heads=8, n_kv_heads=2, d_model=32, head_dim=4, d_ff=64, vocab_size=10,
                max_positions=64, positional="rope", norm="rmsnorm", norm_placement="pre", causal=True,
                is_encoder_decoder=False)
    return ModelConfig(**{**base, **changes})


def test_query_heads_read_their_kv_head_in_groups():
    cfg = config()
    assert cfg.kv_group == 4 and [cfg.kv_head(h) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [config(n_kv_heads=8).kv_head(h) for h in range(8)] == list(range(8))      # no grouping
    assert {config(n_kv_heads=1).kv_head(h) for h in range(8)} == {0}                   # multi-query


def test_a_layers_window_rotation_and_mask_follow_its_type():
    cfg = config(layer_types=("sliding", "full", "sliding", "full"), sliding_window=3, rope_theta=1e6,
                 rope_local_theta=1e4)
    assert [cfg.layer_window(l) for l in range(4)] == [3, None, 3, None]
    assert [cfg.layer_rope_theta(l) for l in range(4)] == [1e4, 1e6, 1e4, 1e6]
    same_base = config(layer_types=("sliding",) * 4, sliding_window=3, rope_local_theta=10000.0)
    assert not same_base.local_rope(0) and same_base.layer_rope_theta(0) == 10000.0
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert torch.equal(layer_mask(cfg, 0, 6), (j <= i) & (i - j < 3))
    assert torch.equal(layer_mask(cfg, 1, 6), j <= i)
    assert torch.equal(layer_mask(config(causal=False), 0, 4), torch.ones(4, 4, dtype=torch.bool))
    # positions from a start, and the one-query form a cached step uses
    assert torch.equal(position_mask(torch.tensor([7]), torch.arange(9), False, 3)[0], torch.arange(9) > 4)
    assert torch.equal(layer_mask(cfg, 0, 4, start=5), layer_mask(cfg, 0, 4))


def test_the_model_rotates_each_layer_with_its_own_base():
    _, model = tiny.family_pair("gemma3")
    cfg, stack = model.config, model.stack
    assert model.inv_freq_local is not None
    for layer in range(cfg.n_layers):
        expected = model.inv_freq_local if cfg.layer_type(layer) == "sliding" else model.inv_freq
        assert model.layer_inv_freq(stack, layer) is expected
        cos, _ = model.layer_rope(stack, layer, torch.arange(5)[None])
        assert torch.allclose(cos[0, 0, 3, :expected.shape[0]], torch.cos(3 * expected).to(cos.dtype))


def test_the_soft_cap_keeps_scores_within_c_and_leaves_them_without_one():
    s = torch.tensor([-100.0, -1.0, 0.0, 2.0, 50.0])
    capped = soft_cap(s, 5.0)
    assert torch.allclose(capped, 5.0 * torch.tanh(s / 5.0)) and capped.abs().max() <= 5.0
    assert soft_cap(s, None) is s
    inplace = s.clone()
    assert soft_cap(inplace, 5.0, inplace=True).data_ptr() == inplace.data_ptr()
    assert torch.allclose(inplace, capped)
    grad = s.clone().requires_grad_()
    soft_cap(grad * 1, 5.0, inplace=True).sum().backward()                              # autograd-safe in place
    assert torch.allclose(grad.grad, 1 - torch.tanh(s / 5.0) ** 2)


def test_one_index_rule_refuses_negatives_and_names_the_range():
    assert check_index(2, 4, "layer", "the model has layers") == 2
    for bad in (-1, 4, 1.0, True, "1"):
        with pytest.raises(IndexRangeError, match=r"layer .*0\.\.3") as caught:
            check_index(bad, 4, "layer", "the model has layers")
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, IndexError)
    cfg = config()
    assert cfg.check_head(3, 7) == (3, 7)
    with pytest.raises(ValueError, match=r"head 8 is out of range: layer 1 has heads 0\.\.7"):
        cfg.check_head(1, 8)
    with pytest.raises(ValueError, match=r"layer -1 is out of range: the model has layers 0\.\.3"):
        cfg.check_layer(-1)


def test_the_model_checks_heads_of_the_stack_that_reads_the_text():
    marian = load_model(tiny.save(tiny.marian()), device="cpu")
    n = len(marian.encoder.blocks)
    with pytest.raises(ValueError, match=rf"the encoder has layers 0\.\.{n - 1}"):
        marian.check_head(n, 0)
    llama = load_model(tiny.save(tiny.llama()), device="cpu")
    with pytest.raises(ValueError, match="head -1 is out of range"):
        llama.check_head(0, -1)
    with pytest.raises(ValueError, match="layer 9 is out of range"):
        llama.head_weights(9)


# the old copies of the formulas, as they were written before they lived in one place
COPIES = {
    "query head → KV head": re.compile(r"n_heads\s*//\s*\(?[\w.]*n_kv_heads|//\s*\(\w+\.n_heads\s*//"),
    "the soft-cap": re.compile(r"\*\s*torch\.tanh\(\s*\w+\s*/\s*[\w.]*(soft)?cap|tanh\([^)]*softcap\)\s*\*"),
    "a sliding layer's window": re.compile(r'layer_type\([^)]*\)\s*==\s*"sliding"\s+and\s+\w+\.sliding_window|'
                                           r'sliding_window\s+if\s+[^\n]*layer_type'),
    "a sliding layer's rotation": re.compile(r'local=[^,)\n]*layer_type\([^)]*\)\s*==\s*"sliding"'),
    "an index check of its own": re.compile(r"^def check_head\(model", re.M),
}
HOMES = {"query head → KV head": "core/config.py", "a sliding layer's window": "core/config.py",
         "the soft-cap": "core/attention.py"}
# the page's own check of what a user typed (ui/services/checks.py) parses text into the same rule, as a UserError
OWN_CHECKS = {"ui/services/checks.py": {"an index check of its own"}}


def test_the_old_copies_are_gone():
    """Every formula above has one home; no other module of core/, ui/, bench/ or scripts/ writes it again."""
    found = []
    for folder in ("core", "ui", "bench", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            rel = path.relative_to(ROOT).as_posix()
            for name, pattern in COPIES.items():
                if HOMES.get(name) != rel and name not in OWN_CHECKS.get(rel, ()) and pattern.search(text):
                    found.append(f"{rel}: {name}")
    assert not found, "written again outside its home: " + "; ".join(found)
    assert re.search(r"def kv_head\(", (ROOT / "core/config.py").read_text()), "the pattern's home moved"
