"""Words a reader can look up: the glossary the page shows on hover, and the equation numbers docs/theory.md
defines (each heading "### eq. N.M — …"), which the page turns into links that open that equation.

Gradio-free: ui/lookup.py puts both into the page's script; tests read them directly."""

from __future__ import annotations

import html
import re
from pathlib import Path

from core.analysis.heads import SINK_EPSILON

THEORY_PATH = Path(__file__).resolve().parents[1] / "docs" / "theory.md"

# term → one sentence in the project's words; the key is how the term is written where its case matters
GLOSSARY: dict[str, str] = {
    "sink": "An attention sink is a token, most often the first, that many heads give a large weight to whatever the "
            "text says, a place to put weight when a head has nothing better to read.",
    "logit lens": "Reading the residual stream after some layer through the final norm and the output layer, to see "
                  "which next token the model already favours at that depth.",
    "surprisal": "How unexpected a token was to the model: −log p(token | the text before it), in nats, so 0 means "
                 "certain and every extra nat means e times less likely.",
    "foil": "The wrong answer a prediction is compared with (in IOI the name that should not come next), so that "
            "logit(answer) − logit(foil) measures the choice between the two.",
    "IOI": "Indirect-object identification, a test sentence such as \"When Mary and John went out, John gave a book "
           "to\" whose right ending is the name mentioned only once (Mary).",
    "resid_pre": "The residual stream as it enters a layer, before that layer's attention and feed-forward outputs "
                 "are added to it.",
    "resid_post": "The residual stream as it leaves a layer, after that layer's attention and feed-forward outputs "
                  "have been added.",
    "denoising": "Activation patching from the clean run into the corrupted one: a score of 1 means this one patch "
                 "brings the clean answer back.",
    "noising": "Activation patching from the corrupted run into the clean one: a score near 0 means the clean answer "
               "needs the activation that was replaced.",
    "activation patching": "Running the model on one prompt while one activation is replaced by its value from "
                           "another prompt, to measure how much that activation carries the difference between "
                           "their answers.",
    "integrated gradients": "An attribution that averages the gradient along a straight path from a baseline input "
                            "to the real one and multiplies by their difference, so the parts add up to the change "
                            "in the output.",
    "completeness error": "How far the attributions of integrated gradients miss adding up to the output's change "
                          "from the baseline, which shrinks as the path is cut into more steps.",
    "nats": "The unit of information when logarithms are natural: one nat is log e, about 1.44 bits.",
    "Spearman's ρ": "The rank correlation of two lists: Pearson's correlation of their ranks, 1 when both order the "
                    "items the same way and −1 when one reverses the other.",
    "softmax": "The function that turns a row of scores into weights that are positive and sum to 1, "
               "e^(s_j) / Σ_k e^(s_k), so a larger score gets an exponentially larger share.",
    "d_k": "The width of one attention head's queries and keys (head_dim), often d_model divided by the number of "
           "heads; the scores are divided by √d_k (eq. 2.2).",
    "causal mask": "The mask that lets token i read only itself and earlier tokens, by giving every later key a score "
                   "of −∞ (eq. 2.3).",
    "padding mask": "The mask that gives padding tokens a score of −∞ as keys, so texts batched at different lengths "
                    "read only their own real tokens (eq. 2.4).",
    "cross-attention": "Attention whose queries come from the decoder and whose keys and values come from the "
                       "encoder's output, the way a decoder reads its source (eq. 5.7).",
    "residual stream": "The running sum each token carries through the layers: the embedding plus every attention "
                       "and feed-forward output added so far.",
    "Pre-LN": "A block that normalises each sublayer's input and adds the sublayer's output to the residual stream "
              "unchanged, x + f(norm(x)) (eq. 5.5).",
    "Post-LN": "The original block, which adds a sublayer's output to its input and normalises the sum, "
               "norm(x + f(x)) (eqs. 5.1–5.4).",
    "RMSNorm": "A LayerNorm without the mean and the shift: each row is divided by its root mean square and scaled "
               "by a learned gain (eq. 5.6).",
    "SwiGLU": "A gated feed-forward network, down(SiLU(gate(x)) ⊙ up(x)), where one projection decides per hidden "
              "unit how much of another passes (eq. 6.13).",
    "GQA": "Grouped-query attention: several query heads share one key/value head, which shrinks the KV cache by "
           "the size of the group (eq. 6.11).",
    "MQA": "Multi-query attention: every query head shares a single key/value head, the smallest KV cache "
           "(eq. 6.11 with one key/value head).",
    "KV cache": "The keys and values of the tokens already seen, kept during generation so each new token computes "
                "only its own (its size is eq. 6.9).",
    "RoPE": "Rotary position embedding: queries and keys are rotated pair by pair by an angle proportional to their "
            "position, so their dot product depends only on the distance (eq. 6.2).",
    "ALiBi": "Attention with linear biases: no position embedding, but a penalty on each score that grows linearly "
             "with the distance from query to key, with one slope per head (eq. 6.3).",
    "induction head": "A head that, at a token seen before, attends to the token that followed its earlier "
                      "occurrence, so the model can continue a repeated sequence.",
    "previous-token head": "A head whose every query puts most of its weight on the token just before it.",
    "logit difference": "logit(answer) − logit(foil): how strongly the model prefers the right answer to the wrong "
                        "one, the number patching and attribution explain.",
    "logit": "The score the output layer gives one token of the vocabulary before the softmax turns the scores into "
             "probabilities; the larger a token's logit, the more likely it is to come next.",
    "entropy": "How spread a row of weights or probabilities p is, −Σ p·log p in nats: 0 when all the weight sits on "
               "one item, log n when it is spread evenly over n.",
    "one-hot": "A vector that is 1 in one place and 0 everywhere else; a softmax is near one-hot when nearly all its "
               "weight goes to a single key.",
    "prefill": "The first pass of generation, which reads the whole prompt at once and fills the KV cache with its "
               "keys and values before the model writes its first new token.",
    "dtype": "The number format a tensor is stored in (float32, bfloat16, …), which sets how many bytes each number "
             "takes and how precise it is.",
    "bfloat16": "A 16-bit floating-point format with float32's range but only about three significant digits, so "
                "weights and caches take half the memory of float32.",
    "permutation-equivariant": "Said of a function that, given its inputs in another order, returns the same outputs "
                               "in that same order, as attention does without positions or a mask.",
    "K-composition": "How much a later head's keys read what an earlier head wrote into the residual stream, "
                     "scored from the two heads' weights alone with no text (Elhage et al. 2021): large where the "
                     "earlier head's outputs land in the directions the later head's keys read.",
    "relative score": "A key's score q·k minus the weighted mean of its query's scores over every key, "
                      "score(i, j) − Σ_k a_ik·score(i, k): the part of the score the softmax reads, since adding the "
                      "same amount to every key's score changes no weight.",
    "Sink^ε": "Gu et al.'s share of sink heads: the fraction of heads whose mean attention on the text's first token "
              f"exceeds a threshold ε (here ε = {SINK_EPSILON:g}).",
    "peak memory": "The most memory a process held at any moment while it ran, which is what decides whether a "
                   "computation fits in the machine, however briefly it held it.",
    "crossover length": "The text length from which an approximation of attention runs faster than exact attention "
                        "on a given machine, exact attention being the faster below it.",
    "sparse attention": "Attention in which each query reads only some of the keys (its k best, or the blocks of a "
                        "fixed pattern such as BigBird's), so most of the n² pairs are never weighed.",
    "linear attention": "Attention whose cost grows as n rather than n², by replacing softmax's exp(q·k) with a "
                        "product of features (Performer) or by mixing the keys into a fixed number of rows "
                        "(Linformer), at the price of only estimating the softmax.",
    "W^O": "The output matrix of an attention layer: it maps the heads' outputs, side by side, back to the residual "
           "stream's width d, each head writing through its own d_head rows of it.",
}

# other spellings → the term they mean
ALIASES: dict[str, str] = {
    "attention sink": "sink",
    "Spearman’s ρ": "Spearman's ρ",
    "Spearman ρ": "Spearman's ρ",
    "Spearman's rho": "Spearman's ρ",
    "KV-cache": "KV cache",
    "cross attention": "cross-attention",
    "logit diff": "logit difference",
    "previous token head": "previous-token head",
    "grouped-query attention": "GQA",
    "multi-query attention": "MQA",
    "permutation equivariant": "permutation-equivariant",
    "one hot": "one-hot",
    "bf16": "bfloat16",
    "relative scores": "relative score",
    "peak RSS": "peak memory",
    "crossover": "crossover length",
}

# terms matched only as written: acronyms, and words that are ordinary English in lower case
EXACT_CASE = frozenset({"IOI", "GQA", "MQA", "RoPE", "ALiBi", "d_k", "nats", "W^O", "K-composition", "Sink^ε"})

_HEADING = re.compile(r"^### eq\. (\d+\.\d+) — (.+)$", re.MULTILINE)
_ANY_EQ_HEADING = re.compile(r"^### (eqs?\. [^—]+?) — (.+)$", re.MULTILINE)


def theory_text(path: Path = THEORY_PATH) -> str:
    if not path.is_file():
        raise ValueError(f"docs/theory.md is missing at {path}: the page's theory panel and equation links read it "
                         "from the repository's docs folder")
    return path.read_text(encoding="utf-8")


def theory_anchors(text: str) -> tuple[str, ...]:
    """The equation numbers ("2.1", "5.5", …) that text defines, one per "### eq. N.M — …" heading, in order."""
    return tuple(match.group(1) for match in _HEADING.finditer(text))


def anchor_id(number: str) -> str:
    """The page's element id of an equation: "2.1" → "eq-2-1"."""
    if not re.fullmatch(r"\d+\.\d+", number):
        raise ValueError(f"an equation number is written N.M (as 2.1), not {number!r}")
    return "eq-" + number.replace(".", "-")


def theory_markdown(text: str) -> str:
    """docs/theory.md for the page: every equation heading becomes an <h3> with the id anchor_id gives ("eqs.
    5.1–5.4" takes the id of its first equation with "-range"), the rest stays Markdown. The text is ours."""

    def heading(match: re.Match) -> str:
        label, title = match.group(1), match.group(2)
        numbers = re.findall(r"\d+\.\d+", label)
        ident = anchor_id(numbers[0]) + ("-range" if label.startswith("eqs") else "")
        return f'<h3 id="{ident}" tabindex="-1">{html.escape(label)} — {html.escape(title)}</h3>'

    return _ANY_EQ_HEADING.sub(heading, text)


THEORY_ANCHORS: tuple[str, ...] = theory_anchors(theory_text())
