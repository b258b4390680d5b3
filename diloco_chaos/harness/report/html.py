"""report.html: one self-contained page per run, for a person to see what the faults did to training.

`write_report(run)` takes the finished run read once (diloco_chaos.harness.run.rundir.FinishedRun: events.jsonl,
report.json, and config.json when present; or the run directory's path, read then) and
writes `report.html` plus the two plots it embeds, `plots/eval_loss.png` and `plots/timeline.png`. The page
needs nothing but itself: the PNGs are inlined as base64 data URIs, the CSS is inline, and there are no
scripts, web fonts or links to fetch, so it can be attached to a CI job or a bug and opened offline years later.

What it shows:
* eval loss of the global model over time (the periodic evals of report.json's eval_curve, the final eval as
  a star), with each fault drawn as a shaded, labelled band (F<index>) and the intervals in which the global
  model did not advance (report.json availability.intervals, which count from the first inner step, moved to
  run-start time) as red marks along the bottom;
* a timeline with one row per learner and one for the syncer, colored by state (see `learner_timeline`);
* the verdicts: each invariant's verdict with its figure and bound, violated ones first (read from the run's
  invariants.json, written once as the run ended; computed now only for a run directory without one), the
  errors the run's processes logged, unexpected ones first, expected ones with the injected fault that explains
  them (report.json's `errors`, labelled by diloco_chaos.harness.report.errors), and the discarded work per learner
  (report.json goodput's `discarded_chip_s`: chip-seconds of steps that never reached the global model);
* the metrics table: the run, model quality, progress, goodput and uptime with the downtime intervals, per
  learner steps, steps/s and time in each state, speed profiles and every fault with its timing.

Fault bands (diloco_chaos.harness.report.timeline.fault_bands): each fault spans its `fault_start` to its `fault_end`. A
lasting fault (freeze, slow, the link actions) ends when its `until` clears it; a one-shot kill (kill_chip,
kill_learner, crash_host, kill_syncer) when what it killed recovered (the supervisor logs its fault_end then,
with the time of the record that showed it: the killed learner stepping again after its restart, the repaired
chip rejoining its shrunk learner, the syncer restored from its checkpoint), or at the end of the run if it
never did. The live output, the CLI's table and report.json's faults read the same events.

Times everywhere are seconds since the run's `run_start` event (the origin of report.json's times too).
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from diloco_chaos.chaos import faults
from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.record.learner import Step
from diloco_chaos.harness.record.syncer import Eval
from diloco_chaos.harness.report.results import InvariantFigure, invariant_figures, recorded_invariants
from diloco_chaos.harness.report.timeline import (
    STATE_COLORS,
    Segment,
    fault_bands,
    learner_timeline,
    run_span,
    state_durations,
    syncer_timeline,
)
from diloco_chaos.harness.run.rundir import REPORT_FILE, FinishedRun

__all__ = ["EVAL_PNG", "HTML_FILE", "PLOTS_DIR", "STATE_COLORS", "TIMELINE_PNG", "Page", "fault_bands",
           "learner_timeline", "missing_inputs", "render_html", "state_durations", "syncer_timeline",
           "write_report"]

HTML_FILE = "report.html"
PLOTS_DIR = "plots"
EVAL_PNG = "eval_loss.png"
TIMELINE_PNG = "timeline.png"
DPI = 100

FAULT_COLORS = ("#e377c2", "#8c564b", "#7f7f7f", "#1f77b4", "#ff7f0e", "#9467bd", "#17becf", "#bcbd22")
"""Colors for faults whose action is no registered kind (an old run directory); a kind has its own `colour`."""


# -- plots --------------------------------------------------------------------------------------------------




def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _fault_color(k: int, band: dict[str, Any]) -> str:
    """The fault kind's colour (diloco_chaos/chaos/faults/<action>.py), else one by position."""
    kind = faults.find(band.get("action"))
    return kind.colour if kind is not None else FAULT_COLORS[k % len(FAULT_COLORS)]


def _draw_bands(ax: Any, bands: list[dict[str, Any]]) -> list[Patch]:
    handles = []
    for k, b in enumerate(bands):
        color = _fault_color(k, b)
        ax.axvspan(b["start_s"], max(b["end_s"], b["start_s"] + 0.05), color=color, alpha=0.22, lw=0)
        ax.text(b["start_s"], 0.98 - 0.07 * (k % 4), f" F{b['index']}", transform=ax.get_xaxis_transform(),
                va="top", ha="left", fontsize=8, color=color, fontweight="bold")
        handles.append(Patch(color=color, alpha=0.4, label=f"F{b['index']} {b['describe']}"[:60]))
    return handles


def stalls(report: dict[str, Any], events: list[Event]) -> list[tuple[float, float]]:
    """report.json's downtime intervals moved to seconds since run start (report.json counts them from the
    first inner step, diloco_chaos.harness.report.metrics.downtime's origin); `events`: the run's records, sorted by
    time."""
    steps = [e.t for e in events if isinstance(e, Step)]
    shift = min(steps) - run_span(events)[0] if steps else 0.0
    return [(a + shift, b + shift) for a, b in report.get("availability", {}).get("intervals", [])]


def eval_loss_png(report: dict[str, Any], bands: list[dict[str, Any]], stalled: list[tuple[float, float]],
                  final_t: float | None) -> bytes:
    """The eval-loss curve with the fault bands and the spans in which the global model stalled."""
    fig = Figure(figsize=(9, 3.8), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    handles = _draw_bands(ax, bands)
    for a, b in stalled:
        ax.axvspan(a, b, ymin=0.0, ymax=0.04, color="#d62728", lw=0)
    curve = report.get("eval_curve", [])
    ax.plot([p["t"] for p in curve], [p["loss"] for p in curve], marker=".", color="black", lw=1.2,
            label="eval loss (periodic)")
    if report.get("final_eval_loss") is not None:
        x = final_t if final_t is not None else report.get("wall_s", 0.0)
        ax.plot([x], [report["final_eval_loss"]], marker="*", ms=11, color="#d62728", ls="none",
                label=f"final eval {report['final_eval_loss']:.4f}")
    if stalled:
        handles.append(Patch(color="#d62728", label="global model stalled"))
    end = max(report.get("wall_s") or 0.0, *(p["t"] for p in curve), final_t or 0.0) or 1.0
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("eval loss")
    ax.grid(alpha=0.3)
    ax.legend(handles=[*ax.get_legend_handles_labels()[0], *handles], fontsize=7, loc="upper right")
    return _png(fig)


def timeline_png(learners: dict[int, list[Segment]], syncer: list[Segment], bands: list[dict[str, Any]]) -> bytes:
    """One row per learner (L0 on top) and one for the syncer, colored by state; dashed lines at fault starts."""
    rows = [(f"learner {m}", segs) for m, segs in sorted(learners.items())] + [("syncer", syncer)]
    fig = Figure(figsize=(9, 1.4 + 0.45 * len(rows)), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    for y, (_, segs) in enumerate(reversed(rows)):
        for state, a, b in segs:
            ax.broken_barh([(a, b - a)], (y - 0.35, 0.7), color=STATE_COLORS.get(state, "#000000"),
                           edgecolor="#555555", lw=0.3)
    present = {state for _, segs in rows for state, _, _ in segs}
    end = max((b for _, segs in rows for _, _, b in segs), default=1.0)
    for k, band in enumerate(bands):
        ax.axvline(band["start_s"], color=_fault_color(k, band), ls="--", lw=1)
        ax.text(band["start_s"], 1.0, f"F{band['index']}", transform=ax.get_xaxis_transform(), va="bottom",
                ha="center", fontsize=8, color=_fault_color(k, band), fontweight="bold")
    ax.set_yticks(range(len(rows)), [name for name, _ in reversed(rows)])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0, end or 1.0)
    ax.set_xlabel("seconds since run start")
    shown = [s for s in STATE_COLORS if s in present and s != "up"]  # "up" is training's color: the syncer's
    fig.legend(handles=[Patch(color=STATE_COLORS[s], label=s.replace("_", " ")) for s in shown], fontsize=7,
               loc="outside lower center", ncol=len(shown) or 1)
    return _png(fig)


# -- the page -----------------------------------------------------------------------------------------------


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _run_rows(report: dict[str, Any], config: dict[str, Any]) -> list[tuple[str, str]]:
    rec = config.get("recovery", {})
    policy = (f"learners: {rec.get('policy', '-')} (repair {_fmt(rec.get('repair_s'), 1)} s), syncer: "
              f"{rec.get('syncer_policy', '-')} (repair {_fmt(rec.get('syncer_repair_s'), 1)} s)") if rec else "-"
    return [("scenario", _fmt(report.get("name"))), ("algorithm", _fmt(report.get("algorithm"))),
            ("seed", _fmt(report.get("seed"))),
            ("learners x chips", f"{report.get('learners', '-')} x {report.get('chips_per_learner', '-')}"),
            ("recovery policy", policy), ("wall s", _fmt(report.get("wall_s"), 2)),
            ("train s", _fmt(report.get("train_s"), 2)), ("links", _fmt(report.get("links", {}).get("backend")))]


def _quality_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [("initial eval loss", _fmt(report.get("initial_eval_loss"), 4)),
            ("final eval loss", _fmt(report.get("final_eval_loss"), 4)),
            ("global model finite", _fmt(report.get("global_model_finite")))]


def _progress_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [("tokens trained", _fmt(report.get("tokens_trained"))),
            ("tokens merged", _fmt(report.get("tokens_merged"), 0)),
            ("merges", _fmt(report.get("merge_count"))),
            ("pushes (rejected / superseded)", f"{report.get('pushes', '-')} ({report.get('pushes_rejected', '-')}"
                                               f" / {report.get('pushes_superseded', '-')})"),
            ("longest gap s", _fmt(report.get("longest_gap_s"), 2)),
            ("syncer restarts", _fmt(report.get("syncer_restarts")))]


def _availability_rows(report: dict[str, Any], stalled: list[tuple[float, float]]) -> list[tuple[str, str]]:
    gp = report.get("goodput", {})
    av = report.get("availability", {})
    spans = "; ".join(f"{a:.2f}-{b:.2f} s" for a, b in stalled) or "none"
    return [("goodput", f"{_fmt(gp.get('goodput'), 4)} ({_fmt(gp.get('good_chip_s'), 1)} of "
                        f"{_fmt(gp.get('allocated_chip_s'), 1)} chip-s)"),
            ("uptime", f"{_fmt(av.get('uptime'), 4)} (downtime {_fmt(av.get('downtime_s'), 2)} s, "
                       f"window {_fmt(av.get('window_s'), 1)} s)"),
            ("downtime intervals (s since run start)", spans)]


def _learner_rows(report: dict[str, Any], timeline: dict[int, list[Segment]]) -> list[tuple[str, str]]:
    out = []
    per = report.get("per_learner", {})
    avail = report.get("learner_availability", {})
    for m in sorted({*map(int, per), *timeline}):
        d = per.get(str(m), {})
        extra = f", available {_fmt(avail[str(m)], 4)}" if avail.get(str(m)) is not None else ""
        out.append((f"learner {m} steps", f"{_fmt(d.get('steps'))} ({_fmt(d.get('steps_per_s'))} steps/s, "
                                          f"{_fmt(d.get('tokens'))} tokens{extra})"))
        secs = state_durations(timeline.get(m, []))
        out.append((f"learner {m} time by state", ", ".join(f"{s.replace('_', ' ')} {v:.2f} s"
                                                             for s, v in secs.items()) or "-"))
    return out


def _speed_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(f"learner {p['learner']} slowed to {p['speed']}",
             f"achieved {_fmt(p.get('achieved'), 4)} over {_fmt(p.get('window_s'), 2)} s") for p in
            report.get("speed_profiles", [])]
    return rows or [("speed profiles", "none")]


def _fault_text(b: dict[str, Any]) -> str:
    text = (f"F{b['index']} {b['describe']}: {b['start_s']:.2f} s to {b['end_s']:.2f} s "
            f"({b['end_s'] - b['start_s']:.2f} s, {b['until']}); trigger: {b['trigger']}")
    if b.get("detect_s") is not None:
        text += f"; detected after {b['detect_s']:.3f} s, back after {_fmt(b.get('rejoin_s'))} s more"
    return text + (f"; MISSED: {b['missed']}" if b.get("missed") else "")


def _table(sections: list[tuple[str, list[tuple[str, str]]]]) -> str:
    out = ['<table id="metrics">']
    for title, rows in sections:
        out.append(f'<tbody><tr class="section"><th colspan="2">{html.escape(title)}</th></tr>')
        out += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows]
        out.append("</tbody>")
    return "\n".join([*out, "</table>"])


def _faults_list(bands: list[dict[str, Any]]) -> str:
    items = [f'<li id="fault-{b["index"]}" class="fault"><span class="swatch" style="background:'
             f'{_fault_color(k, b)}"></span>{html.escape(_fault_text(b))}</li>' for k, b in enumerate(bands)]
    empty = "" if bands else '<p class="none">No faults were injected.</p>'
    return "\n".join(['<ul id="faults">', *items, "</ul>", empty])


# -- verdicts: invariants, errors, discarded work ----------------------------------------------------------


def _g(x: Any) -> str:
    """An invariant's figure or bound: 6 significant digits (a bound of 1e-05 is not 0.0000)."""
    return "-" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)


def _figure(f: InvariantFigure) -> str:
    unit = f" {f.unit}" if f.unit else ""
    return f"{_g(f.figure)}{unit}"


def _invariants_table(figures: tuple[InvariantFigure, ...], recorded: bool) -> str:
    """One row per invariant, violated ones first (each group in check_all's order)."""
    rows = sorted(figures, key=lambda f: f.ok)
    out = ['<table id="invariants">', "<tr><th>verdict</th><th>invariant</th><th>figure</th><th>bound</th>"
           "<th>what, and detail</th></tr>"]
    for f in rows:
        verdict = "holds" if f.ok else "VIOLATED"
        unit = f" {f.unit}" if f.unit else ""
        out.append(f'<tr class="invariant {"ok" if f.ok else "fail"}" id="invariant-{html.escape(f.name)}">'
                   f"<td>{verdict}</td><td>{html.escape(f.name)}</td><td>{html.escape(_figure(f))}</td>"
                   f"<td>{html.escape(f.relation)} {html.escape(_g(f.bound) + unit)}</td>"
                   f"<td>{html.escape(f.measure)}{': ' if f.measure and f.detail else ''}{html.escape(f.detail)}"
                   "</td></tr>")
    out.append("</table>")
    source = ("recorded in invariants.json as the run ended" if recorded
              else "computed now: this run directory has no invariants.json")
    empty = '<p class="none">No invariant applies to this run.</p>' if not figures else ""
    return "\n".join([*out, empty, f'<p class="sub">{source}</p>'])


def _errors_list(errors: list[dict[str, Any]]) -> str:
    """Unexpected errors first, then those an injected fault explains, each with that fault."""
    ordered = sorted(errors, key=lambda e: bool(e.get("expected")))
    items = []
    for e in ordered:
        where = f"{e.get('proc', '?')} {e.get('ev')} at {_fmt(e.get('t_s'), 2)} s: {e.get('error')}"
        if e.get("expected"):
            items.append(f'<li class="error expected">expected: {html.escape(where)} '
                         f'<span class="cause">(cause: {html.escape(str(e.get("cause")))})</span></li>')
        else:
            items.append(f'<li class="error unexpected"><b>UNEXPECTED</b>: {html.escape(where)}</li>')
    empty = "" if errors else '<p class="none">No process of the run logged an error.</p>'
    return "\n".join(['<ul id="errors">', *items, "</ul>", empty])


def _discarded_table(report: dict[str, Any]) -> str:
    """Per learner: chip-seconds of steps whose work never reached the global model, of those allocated."""
    gp = report.get("goodput") or {}
    rows = [(f"learner {m}", d) for m, d in sorted((gp.get("per_learner") or {}).items(), key=lambda x: int(x[0]))]
    rows.append(("run", gp))
    out = ['<table id="discarded">', "<tr><th></th><th>discarded chip-s</th><th>allocated chip-s</th>"
           "<th>share</th></tr>"]
    for who, d in rows:
        disc, alloc = d.get("discarded_chip_s"), d.get("allocated_chip_s")
        share = f"{disc / alloc:.1%}" if isinstance(disc, (int, float)) and alloc else "-"
        out.append(f'<tr class="discarded"><th>{who}</th><td>{_fmt(disc, 3)}</td><td>{_fmt(alloc, 3)}</td>'
                   f"<td>{share}</td></tr>")
    return "\n".join([*out, "</table>"])


def _verdict_summary(figures: tuple[InvariantFigure, ...], errors: list[dict[str, Any]],
                     report: dict[str, Any]) -> str:
    failed = [f.name for f in figures if not f.ok]
    unexpected = sum(not e.get("expected") for e in errors)
    inv = (f"invariants: all {len(figures)} held" if not failed
           else f"invariants: {len(failed)} of {len(figures)} violated ({', '.join(failed)})")
    text = (f"{inv}; errors: {unexpected} unexpected, {len(errors) - unexpected} expected; discarded work: "
            f"{_fmt((report.get('goodput') or {}).get('discarded_chip_s'), 3)} chip-s")
    bad = bool(failed or unexpected)
    return f'<p id="verdict-summary" class="{"fail" if bad else "ok"}">{html.escape(text)}</p>'


def _verdicts(page: Page) -> list[str]:
    errors = page.report.get("errors", [])
    return ["<h2>Verdicts</h2>", _verdict_summary(page.invariants, errors, page.report),
            "<h3>Invariants</h3>", _invariants_table(page.invariants, page.invariants_recorded),
            "<h3>Errors</h3>", _errors_list(errors),
            "<h3>Discarded work</h3>", _discarded_table(page.report)]


def _img(id_: str, png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img id="{id_}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


_CSS = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #eee; vertical-align: top; }
tr.section th { background: #f3f3f3; font-size: 1.05em; }
td { font-family: monospace; }
ul#faults { font-size: 0.9em; padding-left: 1.2em; } .swatch { display: inline-block; width: 0.9em;
  height: 0.9em; margin-right: 0.4em; vertical-align: middle; opacity: 0.6; }
.sub { color: #666; font-size: 0.85em; }
h3 { font-size: 1em; margin-top: 1.2em; }
#verdict-summary { font-weight: bold; padding: 4px 8px; } #verdict-summary.fail, tr.fail td { color: #b00020; }
#verdict-summary.fail { background: #fdecee; } #verdict-summary.ok { background: #eaf6ea; }
li.error.unexpected { color: #b00020; } ul#errors { font-size: 0.9em; font-family: monospace; }
"""


@dataclass
class Page:
    """Everything the page shows: report.json and config.json as read, and what was derived from the events."""

    run_dir: Path
    report: dict[str, Any]
    config: dict[str, Any]
    bands: list[dict[str, Any]]
    timeline: dict[int, list[Segment]]
    stalled: list[tuple[float, float]]
    pngs: dict[str, bytes]
    invariants: tuple[InvariantFigure, ...] = ()
    """The invariants' verdicts (invariants.json)."""
    invariants_recorded: bool = True
    """False: the run directory has no invariants.json, `invariants` were computed when the page was made."""


def render_html(page: Page) -> str:
    """The self-contained HTML: the verdicts, the two PNGs inlined, the fault list, the metrics table."""
    report, bands, pngs = page.report, page.bands, page.pngs
    title = f"diloco-chaos report: {report.get('name', page.run_dir.name)} ({report.get('algorithm', '?')})"
    sections = [("run", _run_rows(report, page.config)), ("model quality", _quality_rows(report)),
                ("progress", _progress_rows(report)),
                ("goodput and uptime", _availability_rows(report, page.stalled)),
                ("per learner", _learner_rows(report, page.timeline)), ("speed profiles", _speed_rows(report)),
                ("faults", [(f"F{b['index']}", _fault_text(b)) for b in bands] or [("faults", "none")])]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
        f'<p class="sub">{html.escape(str(page.run_dir))}</p>', *_verdicts(page),
        "<h2>Eval loss, faults shaded</h2>", _img("eval-loss", pngs[EVAL_PNG], "eval loss over time"),
        "<h2>Faults</h2>", _faults_list(bands),
        "<h2>Timeline</h2>", _img("timeline", pngs[TIMELINE_PNG], "learner and syncer states over time"),
        "<h2>Metrics</h2>", _table(sections), "</body></html>", ""])


def missing_inputs(run_dir: str | os.PathLike[str]) -> list[str]:
    """The files a report needs that `run_dir` lacks (empty: it can be reported on)."""
    return [name for name in (EVENTS_FILE, REPORT_FILE) if not (Path(run_dir) / name).is_file()]


def write_report(run: FinishedRun | str | os.PathLike[str]) -> Path:
    """Write report.html and plots/{eval_loss,timeline}.png into the run's directory; returns the HTML's path.
    A run directory's path is read once here."""
    run_dir = run.run_dir if isinstance(run, FinishedRun) else Path(run)
    missing = missing_inputs(run_dir)
    if missing:
        raise FileNotFoundError(f"{run_dir} has no {' and no '.join(missing)}: not a finished run directory")
    run = FinishedRun.of(run)
    report, config, events = run.report, run.config, run.log.records
    bands, timeline, stalled = fault_bands(events), learner_timeline(events), stalls(report, events)
    final = next((e.t for e in events if isinstance(e, Eval) and e.kind == "final"), None)
    final_s = final - run_span(events)[0] if final is not None else None
    pngs = {EVAL_PNG: eval_loss_png(report, bands, stalled, final_s),
            TIMELINE_PNG: timeline_png(timeline, syncer_timeline(events), bands)}
    plots = run_dir / PLOTS_DIR
    plots.mkdir(exist_ok=True)
    for name, data in pngs.items():
        (plots / name).write_bytes(data)
    out = run_dir / HTML_FILE
    recorded = recorded_invariants(run_dir)
    figures = recorded if recorded is not None else invariant_figures(run)
    out.write_text(render_html(Page(run_dir, report, config, bands, timeline, stalled, pngs, figures,
                                    recorded is not None)), encoding="utf-8")
    return out
