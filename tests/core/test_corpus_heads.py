"""One head over a corpus: top examples and decile samples equal a brute-force search over each text's own
attention map (capture.layer_map, one text at a time) whatever the padded batching; the q/k plane's vectors equal
a single-text pass's and give the head's scores; the plane is centred and of the stated shape, and a corpus of one
text gives the Inside tab's plane (anatomy.qk_geometry) of that text."""
import pytest
import torch

from core import load_model
from core.analysis import anatomy
from core.analysis.capture import layer_map
from core.plane import joint_plane
from core.corpus import heads
from tests import tiny

LENGTHS = [9, 4, 13, 1, 9, 6, 12, 3]


@pytest.fixture(scope="module")
def llama():
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu")


@pytest.fixture(scope="module")
def bert():
    return load_model(tiny.save(tiny.bert()), device="cpu")


def random_texts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB - 1, (n,), generator=gen) for n in lengths]


def brute_force(model, texts, layer, head, skip, causal):
    """Every counted place of every text, from its own full map: (weight, text, query, key) lists."""
    found = []
    for i, ids in enumerate(texts):
        probs = layer_map(model, ids[None], layer)[head]                    # [n, n]
        n = len(ids)
        for q in range(n):
            for k in range(n):
                if (causal and k > q) or ("sink" in skip and k == 0) or ("self" in skip and k == q):
                    continue
                found.append((float(probs[q, k]), i, q, k))
    return found


def places_of(examples):
    return [(e.text, e.query, e.key) for e in examples]


@pytest.mark.parametrize("build", ["llama", "bert"])
@pytest.mark.parametrize("skip", [heads.SKIPS, ()])
def test_top_examples_equal_a_brute_force_search(build, skip, request):
    model = request.getfixturevalue(build)
    texts = random_texts(LENGTHS)
    layer, head = 1, 2
    found = brute_force(model, texts, layer, head, skip, causal=build == "llama")
    got = heads.top_examples(model, texts, layer, head, k=12, skip=skip, per_decile=3, batch_tokens=30)
    assert got.places == got.sampled == len(found) and got.n == len(texts) and got.note == ""

    want = sorted(found, key=lambda f: (-f[0], f[1], f[2], f[3]))[:12]
    assert places_of(got.top) == [f[1:] for f in want]
    torch.testing.assert_close(torch.tensor([e.weight for e in got.top]), torch.tensor([f[0] for f in want]),
                               atol=1e-5, rtol=0)

    # deciles: ranks by weight (ties by hash), the 3 of smallest hash from each tenth
    weight = torch.tensor([f[0] for f in found])
    text, query, key = (torch.tensor([f[j] for f in found]) for j in (1, 2, 3))
    hashed = heads.place_hash(text, query, key)
    ranked = sorted(range(len(found)), key=lambda j: (found[j][0], int(hashed[j])))
    m = len(found)
    assert len(got.deciles) == 10
    for d, shown in enumerate(got.deciles):
        members = ranked[d * m // 10:(d + 1) * m // 10]
        sample = sorted(members, key=lambda j: int(hashed[j]))[:3]
        assert sorted(places_of(shown)) == sorted(found[j][1:] for j in sample), d
        assert [e.weight for e in shown] == sorted((e.weight for e in shown), reverse=True)
        assert got.edges[d] == pytest.approx(float(weight[ranked[d * m // 10]]), abs=1e-5)
    assert got.edges[10] == pytest.approx(float(weight.max()), abs=1e-5)

    # padding never appears: every shown place lies in its own text, its ids are the text's
    for e in got.top + [e for group in got.deciles for e in group]:
        ids = texts[e.text]
        assert e.query < len(ids) and e.key < len(ids)
        assert torch.equal(e.query_ids, ids[max(0, e.query - 5):e.query + 6])
        assert torch.equal(e.key_ids, ids[e.key_from:e.key + 6]) and e.key_from == max(0, e.key - 5)


def test_top_examples_do_not_depend_on_the_batching(llama):
    texts = random_texts(LENGTHS, seed=3)
    one = heads.top_examples(llama, texts, 0, 1, k=5, batch_tokens=10_000)
    many = heads.top_examples(llama, texts, 0, 1, k=5, batch_tokens=14)
    assert places_of(one.top) == places_of(many.top)
    assert [places_of(g) for g in one.deciles] == [places_of(g) for g in many.deciles]
    # a hashed sample of 40 places: the same 40 however the texts are batched, and said
    small, other = (heads.top_examples(llama, texts, 0, 1, k=5, sample_places=40, batch_tokens=b) for b in (14, 10_000))
    assert small.sampled == 40 and small.places == one.places and "hashed sample of 40" in small.note
    assert [places_of(g) for g in small.deciles] == [places_of(g) for g in other.deciles]
    assert places_of(small.top) == places_of(one.top)                     # top stays exact


def test_top_examples_stop_refusals_and_short_texts(llama):
    texts = random_texts(LENGTHS)
    seen = []
    stopped = heads.top_examples(llama, texts, 0, 0, batch_tokens=14, progress=lambda d, t: seen.append(d),
                                 stop=lambda: len(seen) > 0)
    assert 0 < stopped.n < len(texts) and "stopped after" in stopped.note
    lone = heads.top_examples(llama, [torch.tensor([5])], 0, 0)
    assert lone.places == 0 and lone.top == [] and "no place counted" in lone.note
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        heads.top_examples(llama, texts, 2, 0)
    with pytest.raises(ValueError, match="heads 0..3"):
        heads.top_examples(llama, texts, 0, 4)
    with pytest.raises(ValueError, match="skip takes"):
        heads.top_examples(llama, texts, 0, 0, skip=("bos",))


def test_qk_vectors_equal_a_single_text_pass_and_give_the_scores(llama):
    texts = random_texts(LENGTHS, seed=1)
    layer, head = 1, 3                                       # query head 3 reads key/value head 1 (4 heads, 2 kv)
    plane = heads.qk_over(llama, texts, layer, head, batch_tokens=30)
    n = sum(LENGTHS)
    assert plane.queries.shape == plane.keys.shape == (n, 12) and plane.tokens == n and plane.note == ""
    assert plane.points.shape == (2 * n, 2) and plane.is_key.sum() == n and not plane.is_key[:n].any()
    for i, ids in enumerate(texts):
        rows = (plane.text[:n] == i).nonzero().squeeze(-1)
        assert plane.position[rows].tolist() == list(range(len(ids))) and torch.equal(plane.token[rows], ids)
        with torch.inference_mode():
            records = llama(ids[None], record=["q", "k"]).records
        torch.testing.assert_close(plane.queries[rows], records["q"][layer][0, :, head], atol=1e-5, rtol=0)
        torch.testing.assert_close(plane.keys[rows], records["k"][layer][0, :, head // 2], atol=1e-5, rtol=0)
        # q·k × scale is the pre-softmax score: log softmax differs from it by one constant per row
        scores = plane.queries[rows] @ plane.keys[rows].T * plane.scale                        # [n, n]
        logp = layer_map(llama, ids[None], layer)[head].clamp_min(1e-30).log()
        for q in range(len(ids)):
            gap = logp[q, :q + 1] - scores[q, :q + 1]
            torch.testing.assert_close(gap, gap[:1].expand_as(gap), atol=1e-4, rtol=0)
    assert plane.scale == pytest.approx(12 ** -0.5)


@pytest.mark.parametrize("build", ["llama", "bert"])
def test_a_corpus_of_one_text_gives_the_single_text_plane(build, request):
    """One plane, one definition: qk_over on a corpus of one text and anatomy.qk_geometry (the Inside tab's) on
    that text give the same points, axes (signs included), shift and variance shares."""
    model = request.getfixturevalue(build)
    ids = random_texts([11], seed=3)[0]
    for layer, head in ((0, 0), (1, 3)):
        plane = heads.qk_over(model, [ids], layer, head)
        single = anatomy.qk_geometry(model, ids[None], layer, head)
        torch.testing.assert_close(plane.points, torch.cat([single.queries, single.keys]), atol=1e-5, rtol=0)
        torch.testing.assert_close(plane.components, single.components, atol=1e-5, rtol=0)
        torch.testing.assert_close(plane.shift, single.shift, atol=1e-5, rtol=0)
        torch.testing.assert_close(plane.explained, single.explained, atol=1e-6, rtol=0)


def test_the_plane_keeps_its_signs_whatever_the_vectors_order():
    """PCA axes are defined up to sign: joint_plane fixes each axis's largest-magnitude loading positive, so the
    same vectors give the same points in any order, and flipping every vector flips the points, not the axes."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(40, 8, generator=gen) * torch.arange(1, 9), torch.randn(40, 8, generator=gen) + 3
    plane = joint_plane(q, k)
    order = torch.randperm(40, generator=gen)
    again = joint_plane(q[order], k[order])
    torch.testing.assert_close(again.components, plane.components, atol=1e-6, rtol=0)
    torch.testing.assert_close(again.points, torch.cat([plane.points[:40][order], plane.points[40:][order]]),
                               atol=1e-5, rtol=0)
    flipped = joint_plane(-q, -k)
    torch.testing.assert_close(flipped.components, plane.components, atol=1e-6, rtol=0)
    torch.testing.assert_close(flipped.points, -plane.points, atol=1e-5, rtol=0)
    assert (plane.components.gather(1, plane.components.abs().argmax(1, keepdim=True)) > 0).all()
    with pytest.raises(ValueError, match=r"\[N, d\]"):
        joint_plane(q, k[:3])


def test_the_plane_is_centred_and_the_cap_is_spread(llama):
    texts = random_texts(LENGTHS, seed=2)
    plane = heads.qk_over(llama, texts, 0, 1)
    n = len(plane.queries)
    torch.testing.assert_close(plane.points.mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    # the keys were moved onto the queries' mean, so each cloud is centred on its own
    torch.testing.assert_close(plane.points[:n].mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(plane.shift, plane.queries.mean(0) - plane.keys.mean(0), atol=1e-5, rtol=0)
    torch.testing.assert_close(plane.components @ plane.components.T, torch.eye(2), atol=1e-5, rtol=0)
    union = torch.cat([plane.queries, plane.keys + plane.shift])
    torch.testing.assert_close(plane.points, (union - union.mean(0)) @ plane.components.T, atol=1e-4, rtol=0)
    assert 0 < plane.explained[1] <= plane.explained[0] < 1

    capped = heads.qk_over(llama, texts, 0, 1, max_points=20, batch_tokens=14)
    again = heads.qk_over(llama, texts, 0, 1, max_points=20)
    assert len(capped.queries) == 10 and capped.points.shape == (20, 2) and "10 of the 57 tokens" in capped.note
    assert torch.equal(capped.text, again.text) and torch.equal(capped.position, again.position)
    starts = torch.tensor([0] + LENGTHS).cumsum(0)
    assert (starts[capped.text[:10]] + capped.position[:10]).tolist() == [i * 57 // 10 for i in range(10)]
    with pytest.raises(ValueError, match="max_points must be at least 4"):
        heads.qk_over(llama, texts, 0, 1, max_points=3)
