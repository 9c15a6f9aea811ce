"""Words a reader can look up, on the whole page: a glossary term in the app's own prose gets its definition on
hover (and on focus, for the keyboard and touch: shown until focus moves or Escape, and never in the way of a tap
on what it covers), and every "eq. N.M" becomes a link that opens that equation of
docs/theory.md in the "Theory" panel at the bottom of the page.

The script walks text nodes only, of the app's prose (Markdown and HTML outputs, labels), after every update of the
page (a MutationObserver, debounced). It skips fields, code, buttons, links and anything marked as user text
(USER_TEXT), and builds every node it adds with document.createElement and textContent: no page text is ever parsed
as HTML. A text node Gradio owns is kept in place, emptied, with the new nodes after it; when Gradio writes to it
again, the nodes made from its old text are removed and the new text is walked afresh.
"""

from __future__ import annotations

import json

from ui.glossary import ALIASES, EXACT_CASE, GLOSSARY, THEORY_ANCHORS, theory_markdown, theory_text

PANEL_ID = "theory-panel"
PANEL_TITLE = "Theory (docs/theory.md)"
# views that show the user's own text: their words are not ours to annotate
USER_TEXT = (".user-text", "[data-user-text]", "#heads-surprisal", "#gen-step-text", "#corpus-examples")

LOOKUP_JS = """
() => {
  if (window.__lookup) return;
  window.__lookup = true;
  const TERMS = __TERMS__;            // [[written form, term, definition, exact case], ...] longest first
  const ANCHORS = new Set(__ANCHORS__);  // equation numbers docs/theory.md defines: "2.1", ...
  const PANEL = "__PANEL__";
  const ROOTS = '.prose, [data-testid="block-info"]';
  const SKIP = 'textarea, input, select, option, button, a, abbr, code, pre, kbd, samp, script, style, svg, '
    + '[contenteditable]:not([contenteditable="false"]), __USER_TEXT__';
  const BLOCK = 'p, li, td, th, h1, h2, h3, h4, h5, h6, dt, dd, blockquote, figcaption, [data-testid="block-info"]';
  const escape = (s) => s.replace(/[.*+?^${}()|[\\]\\\\]/g, "\\\\$&");
  const byForm = new Map(TERMS.map(([form, term, text, exact]) => [form.toLowerCase(), {form, term, text, exact}]));
  const GLOSS = new RegExp("(?<![\\\\p{L}\\\\p{N}_])(" + TERMS.map(([form]) => escape(form)).join("|")
    + ")(?:e?s)?(?![\\\\p{L}\\\\p{N}_])", "giu");
  const EQ = /\\b(eqs?\\.)(\\s*)(\\d+\\.\\d+[a-d]?(?:\\s*(?:[\\u2013\\u2014-]|,|and|or)\\s*\\d+\\.\\d+[a-d]?)*)/g;
  const NUMBER = /\\d+\\.\\d+[a-d]?/g;
  const made = new WeakMap();  // an emptied text node → the nodes made from its text

  const style = document.createElement("style");
  style.textContent = `
    abbr.gloss { text-decoration: underline dotted; text-underline-offset: 2px; cursor: help; position: relative; }
    abbr.gloss:focus { outline: 2px solid var(--color-accent, #f97316); outline-offset: 1px; }
    abbr.gloss:focus::after { content: attr(title); position: absolute; left: 0; top: 1.4em; z-index: 50;
      pointer-events: none;  /* a tap on what it covers (a link, say) reaches that, and the blur closes it */
      width: max-content; max-width: min(320px, 80vw); white-space: normal; padding: 6px 8px; border-radius: 4px;
      background: var(--background-fill-primary, #fff); color: var(--body-text-color, #111);
      border: 1px solid var(--border-color-primary, #ccc); font-size: 0.9em; font-weight: normal; }
    a.eq-link { text-decoration: underline; cursor: pointer; }
    #${PANEL} h3.eq-target { outline: 2px solid var(--color-accent, #f97316); outline-offset: 2px; }`;
  document.head.appendChild(style);

  const blockOf = (node) => node.parentElement.closest(BLOCK) || node.parentElement;
  const glossed = (block, term) => [...block.querySelectorAll("abbr.gloss")].some((a) => a.dataset.term === term);

  // the pieces of one text: strings, and {term, text} or {eq} for the nodes to make
  const pieces = (value, block, taken) => {
    const found = [];
    for (const m of value.matchAll(EQ)) {
      const at = m.index + m[1].length + m[2].length;
      let first = true;  // the word "eq." joins the first number's link, so "eq. 2.1" reads as one link
      for (const n of m[3].matchAll(NUMBER)) {
        const base = n[0].replace(/[a-d]$/, "");
        if (ANCHORS.has(base)) found.push({start: first ? m.index : at + n.index, end: at + n.index + n[0].length, eq: base});
        first = false;
      }
    }
    const busy = (s, e) => found.some((f) => f.start < e && s < f.end);
    for (const m of value.matchAll(GLOSS)) {
      const entry = byForm.get(m[1].toLowerCase());
      if (!entry || (entry.exact && m[1] !== entry.form) || taken.has(entry.term) || glossed(block, entry.term)) continue;
      if (busy(m.index, m.index + m[0].length)) continue;
      taken.add(entry.term);
      found.push({start: m.index, end: m.index + m[0].length, term: entry.term, text: entry.text});
    }
    found.sort((a, b) => a.start - b.start);
    return found;
  };

  const node = (value, piece) => {
    const words = value.slice(piece.start, piece.end);
    if (piece.eq) {
      const link = document.createElement("a");
      link.className = "eq-link";
      link.href = "#eq-" + piece.eq.replace(".", "-");
      link.dataset.eq = piece.eq;
      link.title = "Open eq. " + piece.eq + " in the theory panel";
      link.textContent = words;
      return link;
    }
    const abbr = document.createElement("abbr");
    abbr.className = "gloss";
    abbr.title = piece.text;
    abbr.tabIndex = 0;
    abbr.dataset.term = piece.term;
    abbr.textContent = words;
    return abbr;
  };

  const annotate = (text, taken) => {
    const value = text.data;
    const found = pieces(value, blockOf(text), taken);
    if (!found.length) return;
    const out = [];
    let at = 0;
    for (const piece of found) {
      if (piece.start > at) out.push(document.createTextNode(value.slice(at, piece.start)));
      out.push(node(value, piece));
      at = piece.end;
    }
    if (at < value.length) out.push(document.createTextNode(value.slice(at)));
    text.after(...out);
    text.data = "";  // kept, empty, for Gradio to write to again
    made.set(text, out);
  };

  const accept = (text) => {
    if (!text.data.trim() || !text.parentElement) return NodeFilter.FILTER_REJECT;
    const parent = text.parentElement;
    if (parent.closest(SKIP) || parent.closest('[id^="eq-"]')) return NodeFilter.FILTER_REJECT;
    return NodeFilter.FILTER_ACCEPT;
  };

  const walk = (root) => {
    const texts = [];
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {acceptNode: accept});
    while (walker.nextNode()) texts.push(walker.currentNode);
    const takenByBlock = new Map();
    for (const text of texts) {
      const block = blockOf(text);
      if (!takenByBlock.has(block)) takenByBlock.set(block, new Set());
      annotate(text, takenByBlock.get(block));
    }
  };

  const rootsIn = (element) => {
    if (!(element instanceof Element)) return [];
    const own = element.closest(ROOTS);
    return own ? [own] : [...element.querySelectorAll(ROOTS)];
  };

  let pending = new Set(), timer = null;
  const flush = () => {
    timer = null;
    const targets = pending;
    pending = new Set();
    const roots = new Set();
    for (const target of targets) {
      if (!target.isConnected) continue;
      for (const root of rootsIn(target)) roots.add(root);
    }
    for (const root of roots) if (![...roots].some((r) => r !== root && r.contains(root))) walk(root);
  };
  const observer = new MutationObserver((records) => {
    for (const r of records) {
      if (r.type === "characterData") {
        const old = made.get(r.target);
        if (old && r.target.data) {  // Gradio wrote new text: what was made of the old text goes
          old.forEach((n) => n.remove());
          made.delete(r.target);
        }
        if (r.target.parentElement) pending.add(r.target.parentElement);
      } else {
        pending.add(r.target);
      }
    }
    if (!timer) timer = setTimeout(flush, 150);
  });
  observer.observe(document.body, {childList: true, subtree: true, characterData: true});
  pending.add(document.body);
  flush();

  // Escape closes a definition shown by focus (a tap, the keyboard), as moving away does
  document.addEventListener("keydown", (event) => {
    const active = document.activeElement;
    if (event.key === "Escape" && active instanceof Element && active.matches("abbr.gloss")) active.blur();
  });

  // a click on an equation link opens the panel, waits for the equation to be drawn, and brings it into view
  const reveal = (id, tries) => {
    const target = document.getElementById(id);
    if (!target) {
      if (tries > 0) setTimeout(() => reveal(id, tries - 1), 50);
      return;
    }
    document.querySelectorAll(`#${PANEL} h3.eq-target`).forEach((h) => h.classList.remove("eq-target"));
    target.classList.add("eq-target");
    target.scrollIntoView({block: "start"});
    target.focus({preventScroll: true});
  };
  document.addEventListener("click", (event) => {
    const link = event.target instanceof Element ? event.target.closest("a.eq-link") : null;
    if (!link) return;
    event.preventDefault();
    const panel = document.getElementById(PANEL);
    if (!panel) return;
    const content = panel.querySelector('[data-testid="accordion-content"]');
    if (!content || getComputedStyle(content).display === "none") panel.querySelector(".label-wrap").click();
    reveal("eq-" + link.dataset.eq.replace(".", "-"), 100);
  });
}
"""


def lookup_js() -> str:
    """The page's script with the glossary, the equation numbers and the panel's id filled in (all ours)."""
    forms = [(term, term) for term in GLOSSARY] + list(ALIASES.items())
    terms = sorted(([form, term, GLOSSARY[term], form in EXACT_CASE] for form, term in forms),
                   key=lambda entry: -len(entry[0]))
    return (LOOKUP_JS.replace("__TERMS__", json.dumps(terms, ensure_ascii=False))
            .replace("__ANCHORS__", json.dumps(list(THEORY_ANCHORS)))
            .replace("__PANEL__", PANEL_ID)
            .replace("__USER_TEXT__", ", ".join(USER_TEXT)))


def build_lookup() -> str:
    """The "Theory" panel (closed) where it is called, inside a gr.Blocks; returns the script for
    demo.load(None, js=...)."""
    import gradio as gr  # here, so that the script can be built and checked without loading gradio

    with gr.Accordion(PANEL_TITLE, open=False, elem_id=PANEL_ID):
        gr.Markdown(theory_markdown(theory_text()), elem_id="theory-text")
    return lookup_js()
