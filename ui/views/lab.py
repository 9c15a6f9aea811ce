"""The Lab tab's views: a job's training curves and attention snapshots, a trained run's attention on any source,
and the session's runs as JSON; the bodies of the Lab's endpoints that draw."""

from __future__ import annotations

from dataclasses import asdict

from ui.plots.base import empty_figure
from ui.plots.lab import heatmap_grid, training_curves
from ui.services.checks import UserError
from ui.services.lab.runs import Lab
from ui.views import export
def snapshot_count(job) -> int:
    run = job.records[0].run
    return len(run.snapshots) if run is not None else 0


def snapshot_figure(lab: Lab, record):
    snap = lab.snapshots(record)
    if snap is None:
        return empty_figure("No snapshot yet: they are taken after the snapshot steps.")
    axes = ("output", "source") if snap.kind.startswith("cross") else ("query", "key")
    return heatmap_grid(snap.maps, [f"step {s}" for s in snap.steps],
                                  [f"layer {i}" for i in range(snap.maps.shape[1])], snap.query_tokens,
                                  snap.key_tokens, f"{record.id}: {snap.kind} on a held-out example", *axes)


def runs_export(lab: Lab, key: str | None) -> tuple[str, str]:
    """Every run of the session (config, status, summary, curves) and the comparisons' findings as JSON; the body
    of the `export_lab` endpoint. NaN losses (a diverged run) are null. Returns (path, note)."""
    runs = []
    for record in lab.runs(key):
        curve = record.curve()
        runs.append(dict(run=record.id, label=record.label, status=record.status, config=asdict(record.lab),
                         summary=asdict(record.summary()),
                         curves=dict(steps=curve.steps, train_loss=curve.train_loss, eval_steps=curve.eval_steps,
                                     held_loss=curve.held_loss, exact_match=curve.exact_match)))
    if not runs:
        raise UserError("No run yet in this session: train one, then export it.")
    body = export.json_bytes(dict(runs=runs, findings=lab.findings(key)))
    path = export.write(body, "lab-runs.json")
    return str(path), f"{len(runs)} run(s): {', '.join(r['run'] for r in runs)}, their curves and findings."


def job_curves(lab: Lab, job):
    """The training curves of a job's runs, overlaid."""
    title = f"{job.records[0].lab.task}: " + " vs ".join(r.id for r in job.records)
    return training_curves(lab.curves(job), title, max(r.lab.steps for r in job.records))


def run_attention(lab: Lab, key: str | None, run_id, source_text):
    """A trained run's attention on one source: (note, encoder, decoder, cross-attention figures)."""
    v = lab.attention(key, run_id, source_text)
    layers = lambda m: [f"layer {i}" for i in range(m.shape[0])]  # noqa: E731
    heads = lambda m: [f"head {h}" for h in range(m.shape[1])]  # noqa: E731
    enc = crs = None
    if v.cross is not None:
        crs = heatmap_grid(v.cross, layers(v.cross), heads(v.cross), v.target_tokens, v.source_tokens,
                           "Cross-attention: decoder position (predicting the next output) × source", "output", "source")
        enc = heatmap_grid(v.encoder, layers(v.encoder), heads(v.encoder), v.source_tokens, v.source_tokens,
                           "Encoder self-attention (bidirectional)")
    dec = heatmap_grid(v.decoder, layers(v.decoder), heads(v.decoder), v.target_tokens, v.target_tokens,
                       "Decoder self-attention (causal)" if v.cross is not None else
                       "Decoder self-attention over <bos> source <sep> answer (causal)")
    return v.note, enc, dec, crs
