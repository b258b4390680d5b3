"""Tests for diloco_chaos.harness.report.html: the timeline states from hand-built events, the page written for a fake
run directory (self-contained, PNGs that decode), the `report` verb, and the page as a real headless Chromium
renders it (skipped where Debian's chromium is not installed), with its verdicts: invariants (violated first),
labelled errors and discarded work."""

from __future__ import annotations

import base64
import io
import json
import random
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from conftest import complete
from PIL import Image

from diloco_chaos.harness import cli
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.report.html import (
    EVAL_PNG,
    HTML_FILE,
    PLOTS_DIR,
    STATE_COLORS,
    TIMELINE_PNG,
    fault_bands,
    learner_timeline,
    state_durations,
    syncer_timeline,
    write_report,
)
from diloco_chaos.harness.report.results import record_invariants
from diloco_chaos.harness.report.run_report import build_report
from diloco_chaos.harness.run.rundir import CONFIG_FILE, INVARIANTS_FILE, REPORT_FILE, read_json, write_json

T0 = 100.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ev(t: float, name: str, /, proc: str = "supervisor", pid: int = 1, **fields: Any) -> dict[str, Any]:
    """An event `t` seconds after the run started (the log's own clock starts at T0), its record's required
    fields the test leaves out filled with placeholders (conftest.complete)."""
    return complete([{"t": T0 + t, "wall": 1_700_000_000.0 + t, "pid": pid, "proc": proc, "ev": name,
                      **fields}])[0]


def _steps(m: int, spans: list[tuple[float, float]], dt: float = 0.25) -> list[dict[str, Any]]:
    """Learner m stepping every dt within each [a, b)."""
    out, step = [], 0
    for a, b in spans:
        k = 0
        while a + k * dt < b - 1e-9:
            step += 1
            out.append(ev(a + k * dt, "step", proc=f"learner{m}.chip0", pid=200 + m, learner=m, step=step,
                          loss=5.0, tokens=512, chips=2))
            k += 1
    return out


def _fault(t: float, index: int, action: str, learner: int | None, describe: str, end: bool,
           reason: str = "at time") -> dict[str, Any]:
    return ev(t, "fault_end" if end else "fault_start", index=index, action=action, learner=learner,
              describe=describe, reason=reason, elapsed_s=t, progress={"steps": {"0": 1, "1": 1}, "merges": 1})


def sample_events() -> list[dict[str, Any]]:
    """Two learners x 2 chips, 13 s. Learner 0: frozen 3-4, slowed 5-6, link down 7-8, done at 12.
    Learner 1: killed at 2 (down 2.1-3.6, rejoining 3.6-4.5), a chip killed at 6 (shrunk 6.05-8), done at 11.
    Syncer: up at 0.5, killed at 9, back at 10.1, done at 12.5."""
    evs = [ev(0.0, "run_start", algorithm="decoupled", learners=2, chips_per_learner=2, seed=7),
           ev(0.5, "syncer_start", proc="syncer", pid=2, port=1, algorithm="decoupled", fragments=4),
           *_steps(0, [(1.0, 3.0), (4.0, 12.0)]), *_steps(1, [(1.0, 2.0), (4.5, 11.0)]),
           # learner 0
           _fault(3.0, 0, "freeze", 0, "freeze(learner 0)", False),
           ev(3.0, "process_fault", kind="freeze", learner=0, pids=[200], signal="SIGSTOP"),
           ev(4.0, "process_fault_off", kind="freeze", learner=0, pids=[200]),
           _fault(4.0, 0, "freeze", 0, "freeze(learner 0)", True, "until 4.0 s"),
           _fault(5.0, 1, "slow", 0, "slow(learner 0, speed=0.5)", False),
           ev(5.0, "process_fault", kind="slow", learner=0, speed=0.5, period_s=0.2),
           ev(6.0, "process_fault_off", kind="slow", learner=0, cycles=3, stopped_s=0.5),
           _fault(6.0, 1, "slow", 0, "slow(learner 0, speed=0.5)", True, "until 6.0 s"),
           _fault(7.0, 5, "partition", 0, "partition(learner 0)", False),
           ev(7.0, "link_down", proc="learner0.chip0", pid=200, learner=0, reason="timeout"),
           ev(8.0, "link_up", proc="learner0.chip0", pid=200, learner=0, connects=2),
           _fault(8.0, 5, "partition", 0, "partition(learner 0)", True, "until 8.0 s"),
           ev(12.0, "learner_done", proc="learner0.chip0", pid=200, learner=0, steps=40, finite=True),
           ev(12.01, "link_down", proc="learner0.chip0", pid=200, learner=0, reason="closed"),
           # learner 1
           _fault(2.0, 2, "kill_learner", 1, "kill_learner(learner 1)", False),
           ev(2.0, "process_fault", kind="kill_learner", learner=1, pids=[201], signal="SIGKILL"),
           ev(2.1, "learner_down", learner=1, exitcodes={"learner1.chip0": -9}, step=4, repair_s=1.5),
           ev(3.6, "learner_restart", learner=1, generation=1, start_step=4, restarts=1),
           ev(4.0, "initial_pull", proc="learner1.chip0", pid=211, learner=1, step=4, fragments=4),
           _fault(6.0, 3, "kill_chip", 1, "kill_chip(learner 1, chip=1)", False),
           ev(6.0, "process_fault", kind="kill_chip", learner=1, pids=[212], signal="SIGKILL", chip=1),
           ev(6.05, "learner_shrink", learner=1, lost=[1], members=[0], generation=2, step=10, repair_s=1.5),
           ev(7.5, "learner_grow", learner=1, chip=1, members=[0, 1], generation=3, step=16),
           ev(8.0, "chip_joined", proc="learner1.chip1", pid=213, learner=1, chip=1, step=18, rank=1, size=2,
              generation=3),
           ev(11.0, "learner_done", proc="learner1.chip0", pid=211, learner=1, steps=30, finite=True),
           # syncer
           _fault(9.0, 4, "kill_syncer", None, "kill_syncer(syncer)", False, "syncer reached 10 merges"),
           ev(9.0, "process_fault", kind="kill_syncer", learner=None, pids=[2], signal="SIGKILL"),
           ev(9.05, "syncer_down", exitcode=-9, repair_s=1.0),
           ev(9.9, "syncer_restore", proc="syncer", pid=3, merges=10, tokens_merged=5120.0),
           ev(10.0, "syncer_restart", restarts=1, port=1, child_pid=3),
           ev(10.1, "syncer_start", proc="syncer", pid=3, port=1, algorithm="decoupled", fragments=4),
           ev(12.5, "syncer_done", proc="syncer", pid=3, merges=20, tokens_merged=10240.0),
           *(_fault(12.9, i, a, m, d, True, "end of run") for i, a, m, d in
             [(2, "kill_learner", 1, "kill_learner(learner 1)"), (3, "kill_chip", 1, "kill_chip(learner 1, chip=1)"),
              (4, "kill_syncer", None, "kill_syncer(syncer)")]),
           ev(13.0, "run_end", wall_s=13.0),
           ev(13.5, "eval", proc="syncer", pid=3, kind="final", loss=3.1, version=20, tokens_merged=10240.0,
              finite=True)]
    merge_ts = [1.5 + 0.5 * k for k in range(22) if not 9.0 <= 1.5 + 0.5 * k < 10.1]
    evs += [ev(t, "merge", proc="syncer", fragment=k % 4, version=k // 4 + 1, merges=k + 1,
               tokens_merged=512.0 * (k + 1), participants=[0, 1]) for k, t in enumerate(merge_ts)]
    evs += [ev(0.6 + k, "eval", proc="syncer", kind="periodic", version=k, tokens_merged=512.0 * k,
               loss=5.5 - 0.2 * k) for k in range(12) if not 9.0 <= 0.6 + k < 10.1]
    return sorted(evs, key=lambda e: e["t"])


def _check(segments: list[tuple[str, float, float]], expected: list[tuple[str, float, float]]) -> None:
    assert [s for s, _, _ in segments] == [s for s, _, _ in expected]
    assert [x for _, a, b in segments for x in (a, b)] == pytest.approx([x for _, a, b in expected for x in (a, b)])


# -- (1) timeline states from hand-built events ---------------------------------------------------------------


def test_learner_timeline_frozen_slowed_and_link_down() -> None:
    _check(learner_timeline(sample_events())[0],
           [("starting", 0, 1), ("training", 1, 3), ("frozen", 3, 4), ("training", 4, 5), ("slowed", 5, 6),
            ("training", 6, 7), ("link_down", 7, 8), ("training", 8, 12), ("done", 12, 13)])


def test_learner_timeline_down_rejoining_and_shrunk() -> None:
    _check(learner_timeline(sample_events())[1],
           [("starting", 0, 1), ("training", 1, 2.1), ("down", 2.1, 3.6), ("rejoining", 3.6, 4.5),
            ("training", 4.5, 6.05), ("shrunk", 6.05, 8.0), ("training", 8.0, 11.0), ("done", 11.0, 13.0)])


def test_learner_timeline_ignores_event_order_and_covers_the_run() -> None:
    evs = sample_events()
    random.Random(0).shuffle(evs)
    timeline = learner_timeline(evs)
    assert timeline == learner_timeline(sample_events())
    for segs in timeline.values():  # contiguous from run start to run end
        assert segs[0][1] == 0.0 and segs[-1][2] == pytest.approx(13.0)
        assert all(a[2] == b[1] for a, b in zip(segs, segs[1:], strict=False))
        assert all(s in STATE_COLORS for s, _, _ in segs)


def test_learner_timeline_priorities() -> None:
    """Frozen wins over shrunk and link down; down wins over everything and clears the dead processes'
    freeze; a learner that never stepped is starting."""
    evs = [ev(0.0, "run_start", learners=3),
           ev(1.0, "step", learner=0, step=1), ev(2.0, "learner_shrink", learner=0, lost=[1]),
           ev(3.0, "link_down", learner=0, reason="timeout"), ev(4.0, "process_fault", kind="freeze", learner=0),
           ev(5.0, "learner_down", learner=0), ev(6.0, "learner_restart", learner=0),
           ev(7.0, "step", learner=0, step=2), ev(8.0, "process_fault_off", kind="freeze", learner=0),
           ev(1.0, "step", learner=1, step=1), ev(2.0, "process_fault", kind="freeze", learner=1),
           ev(3.0, "learner_done", learner=1), ev(10.0, "run_end")]
    timeline = learner_timeline(evs)
    _check(timeline[0], [("starting", 0, 1), ("training", 1, 2), ("shrunk", 2, 3), ("link_down", 3, 4),
                         ("frozen", 4, 5), ("down", 5, 6), ("rejoining", 6, 7), ("training", 7, 10)])
    _check(timeline[1], [("starting", 0, 1), ("training", 1, 2), ("frozen", 2, 3), ("done", 3, 10)])
    _check(timeline[2], [("starting", 0, 10)])


def test_learner_timeline_of_nothing() -> None:
    assert learner_timeline([]) == {}
    assert syncer_timeline([]) == []


def test_syncer_timeline_down_from_kill_to_replacement() -> None:
    _check(syncer_timeline(sample_events()),
           [("starting", 0, 0.5), ("up", 0.5, 9.0), ("down", 9.0, 10.1), ("up", 10.1, 12.5), ("done", 12.5, 13.0)])


def test_state_durations() -> None:
    secs = state_durations(learner_timeline(sample_events())[1])
    assert secs["down"] == pytest.approx(1.5) and secs["shrunk"] == pytest.approx(1.95)
    assert sum(secs.values()) == pytest.approx(13.0)


def test_fault_bands_lasting_faults_span_start_to_end_kills_to_recovery() -> None:
    bands = {b["index"]: b for b in fault_bands(sample_events())}
    spans = {i: (b["start_s"], b["end_s"]) for i, b in bands.items()}
    assert spans == {0: (3.0, 4.0), 1: (5.0, 6.0), 5: (7.0, 8.0),
                     2: (2.0, 4.5),   # kill_learner: until the restarted learner's first step
                     3: (6.0, 8.0),   # kill_chip: until the repaired chip rejoined
                     4: (9.0, 9.9)}   # kill_syncer: until the syncer was restored
    assert bands[2]["detect_s"] == pytest.approx(0.1) and bands[2]["rejoin_s"] == pytest.approx(2.4)
    assert bands[0]["detect_s"] is None  # the syncer_down at 9 is no reaction to a freeze over at 4
    assert "restarted learner" in bands[2]["until"] and bands[1]["until"] == "until 6.0 s"


def test_fault_band_of_an_unrecovered_kill_runs_to_the_end() -> None:
    evs = [ev(0.0, "run_start", learners=1), ev(1.0, "step", learner=0, step=1),
           _fault(2.0, 0, "kill_learner", 0, "kill_learner(learner 0)", False),
           ev(2.1, "learner_down", learner=0), ev(5.0, "run_end")]
    [band] = fault_bands(evs)
    assert (band["start_s"], band["end_s"], band["until"]) == (2.0, 5.0, "not recovered by run end")


# -- (2) the page for a fake run directory ----------------------------------------------------------------


def sample_report() -> dict[str, Any]:
    """A report.json as build_report writes one (abridged where the page does not look)."""
    return {
        "name": "chaos-sample", "algorithm": "decoupled", "seed": 7, "learners": 2, "chips_per_learner": 2,
        "wall_s": 13.0, "train_s": 10.75, "per_learner": {
            "0": {"steps": 40, "tokens": 20480, "steps_per_s": 3.63, "link": {}},
            "1": {"steps": 30, "tokens": 15360, "steps_per_s": 2.9, "link": {}}},
        "tokens_trained": 35840, "tokens_merged": 10240.0, "merge_count": 20, "pushes": 40, "pushes_rejected": 0,
        "pushes_superseded": 2, "frames_rejected": 0, "initial_eval_loss": 5.5, "final_eval_loss": 3.1,
        "global_model_finite": True,
        "eval_curve": [{"t": round(0.6 + k, 3), "version": k, "tokens_merged": 512.0 * k,
                        "loss": round(5.5 - 0.2 * k, 5)} for k in range(12) if not 9.0 <= 0.6 + k < 10.1],
        "longest_gap_s": 1.5, "errors": [], "links": {"backend": "embedded", "version": "2.12.0"},
        "goodput": {"goodput": 0.61, "good_chip_s": 26.2, "allocated_chip_s": 43.0, "per_learner": {}},
        "availability": {"uptime": 0.95, "downtime_s": 0.5, "window_s": 1.0, "intervals": [[8.0, 8.5]]},
        "speed_profiles": [{"learner": 0, "speed": 0.5, "achieved": 0.55, "window_s": 1.0, "steps": 2,
                            "reference_steps": 4.0}],
        "learner_availability": {"0": 0.9, "1": 0.8}, "syncer_restarts": 1,
    }


def make_run(run_dir: Path, events: list[dict[str, Any]] | None = None,
             report: dict[str, Any] | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / CONFIG_FILE, Scenario().to_dict())
    with open(run_dir / EVENTS_FILE, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in (sample_events() if events is None else events))
    write_json(run_dir / REPORT_FILE, sample_report() if report is None else report)
    return run_dir


class _Dom(HTMLParser):
    """The page's elements by id, and the <li> children of <ul id="faults">."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str | None]] = {}
        self.tags: list[str] = []
        self.fault_items: list[str] = []
        self._in_faults = False
        self._li: list[str] | None = None
        self.rows: list[tuple[str, str]] = []
        """(class, id) of each <tr> and <li> with a class: the verdicts' invariant rows and error items."""
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if a.get("id"):
            self.by_id[str(a["id"])] = {"tag": tag, **a}
        if tag in ("tr", "li") and a.get("class"):
            self.rows.append((str(a["class"]), str(a.get("id") or "")))
        if tag == "ul" and a.get("id") == "faults":
            self._in_faults = True
        elif tag == "li" and self._in_faults:
            self._li = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul":
            self._in_faults = False
        elif tag == "li" and self._li is not None:
            self.fault_items.append("".join(self._li))
            self._li = None

    def handle_data(self, data: str) -> None:
        if self._li is not None:
            self._li.append(data)


def _data_png(src: str | None) -> bytes:
    prefix = "data:image/png;base64,"
    assert src is not None and src.startswith(prefix)
    return base64.b64decode(src[len(prefix):], validate=True)


def _check_page(dom: _Dom, faults: int) -> None:
    for id_ in ("eval-loss", "timeline"):
        assert dom.by_id[id_]["tag"] == "img"
        png = _data_png(dom.by_id[id_].get("src"))
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
        assert Image.open(io.BytesIO(png)).size[0] >= 600
    assert dom.by_id["metrics"]["tag"] == "table"
    assert dom.by_id["faults"]["tag"] == "ul"
    assert len(dom.fault_items) == faults
    for id_ in ("verdict-summary", "invariants", "errors", "discarded"):
        assert id_ in dom.by_id, id_
    verdicts = [c.split()[1] for c, _ in dom.rows if c.startswith("invariant ")]
    assert verdicts and verdicts == sorted(verdicts, key=lambda c: c == "ok"), "violated invariants come first"


def test_write_report_writes_a_self_contained_page_and_pngs(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    out = write_report(run)
    assert out == run / HTML_FILE and out.is_file()
    text = out.read_text()
    for outside in ('src="http', "src='http", "<script", 'href="http', "@import", "url("):
        assert outside not in text
    dom = _Dom(text)
    _check_page(dom, faults=6)
    for name, id_ in ((EVAL_PNG, "eval-loss"), (TIMELINE_PNG, "timeline")):
        png = (run / PLOTS_DIR / name).read_bytes()
        assert png == _data_png(dom.by_id[id_].get("src"))  # the file and the embedded copy are one image
        assert Image.open(run / PLOTS_DIR / name).format == "PNG"
    items = {item.split(" ")[0]: item for item in dom.fault_items}
    assert set(items) == {"F0", "F1", "F2", "F3", "F4", "F5"}
    assert "kill_chip(learner 1, chip=1): 6.00 s to 8.00 s" in items["F3"]
    assert "until the repaired chip rejoined" in items["F3"]


def test_metrics_table_holds_the_run_figures(tmp_path: Path) -> None:
    text = write_report(make_run(tmp_path / "run")).read_text()
    start = text.index('<table id="metrics">')
    table = text[start:text.index("</table>", start)]
    for cell in ("decoupled", ">7<", "2 x 2", "13.00", "3.1000", "5.5000", "10240", "35840", ">20<", "1.50",
                 "0.6100", "0.9500", "learner 0 steps", "3.630 steps/s", "learner 1 time by state",
                 "down 1.50 s", "slowed to 0.5", "achieved 0.5500", "kill_syncer(syncer)", "9.00 s to 9.90 s"):
        assert cell in table, cell
    # report.json counts downtime from the first step (t = 1 s here): shown in run-start time
    assert "9.00-9.50 s" in table


def test_write_report_without_faults(tmp_path: Path) -> None:
    evs = [e for e in sample_events() if not e["ev"].startswith("fault_")]
    text = write_report(make_run(tmp_path / "run", evs)).read_text()
    dom = _Dom(text)
    _check_page(dom, faults=0)
    assert "No faults were injected." in text


def test_write_report_on_build_reports_output(tmp_path: Path) -> None:
    """The page reads report.json as build_report writes it today (fault_response, learner_availability...)."""
    run = make_run(tmp_path / "run")
    write_json(run / REPORT_FILE, build_report(run))
    _check_page(_Dom(write_report(run).read_text()), faults=6)


def _verdict_run(run_dir: Path) -> Path:
    """The sample run with labelled errors and discarded work in its report, and its invariants recorded (the
    sample's hand-built events leave several protocol invariants unverifiable, so they are violated)."""
    report = sample_report()
    report["errors"] = [
        {"proc": "learner1.chip0", "ev": "chip_error", "error": "RuntimeError: Connection reset by peer",
         "t_s": 5.1, "expected": True, "cause": "fault 2: kill_chip(learner 1, chip=1)"},
        {"proc": "syncer", "ev": "syncer_error", "error": "ValueError: bad fragment 9", "t_s": 7.25,
         "expected": False, "cause": None}]
    report["goodput"].update(discarded_chip_s=2.5, per_learner={
        "0": {"allocated_chip_s": 21.5, "discarded_chip_s": 1.25}, "1": {"allocated_chip_s": 21.5,
                                                                         "discarded_chip_s": 1.25}})
    run = make_run(run_dir, report=report)
    record_invariants(run)
    return run


def test_verdicts_violated_invariants_first_errors_labelled_discarded_work(tmp_path: Path) -> None:
    run = _verdict_run(tmp_path / "run")
    recorded = {f["name"]: f for f in read_json(run / INVARIANTS_FILE)["invariants"]}
    failed = [n for n, f in recorded.items() if not f["ok"]]
    assert "token_accounting" in failed and recorded["faults_fired"]["ok"]
    text = write_report(run).read_text()
    dom = _Dom(text)
    _check_page(dom, faults=6)
    order = [i.removeprefix("invariant-") for c, i in dom.rows if c.startswith("invariant ")]
    assert order[:len(failed)] == failed and set(order) == set(recorded)
    row = text[text.index('id="invariant-token_accounting"'):]
    row = row[:row.index("</tr>")]
    assert "VIOLATED" in row and "<td>15360 tokens</td>" in row and "&lt;= 0.001 tokens" in row, row
    assert "recorded in invariants.json" in text
    summary = dom.by_id["verdict-summary"]
    assert summary["class"] == "fail"
    assert f"invariants: {len(failed)} of {len(recorded)} violated" in text
    errors = [c for c, _ in dom.rows if c.startswith("error ")]
    assert errors == ["error unexpected", "error expected"]
    assert "UNEXPECTED</b>: syncer syncer_error at 7.25 s: ValueError: bad fragment 9" in text
    assert "(cause: fault 2: kill_chip(learner 1, chip=1))" in text
    table = text[text.index('<table id="discarded">'):]
    table = table[:table.index("</table>")]
    assert "<th>learner 0</th><td>1.250</td><td>21.500</td><td>5.8%</td>" in table
    assert "<th>run</th><td>2.500</td><td>43.000</td><td>5.8%</td>" in table
    # the page reads the recorded verdicts, it does not check again: an edited file shows
    d = read_json(run / INVARIANTS_FILE)
    d["invariants"] = [dict(f, ok=True) for f in d["invariants"]]
    write_json(run / INVARIANTS_FILE, d)
    assert f"invariants: all {len(recorded)} held" in write_report(run).read_text()


def test_cli_report_prints_the_page_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    assert cli.main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / HTML_FILE)


def test_cli_report_refuses_a_directory_without_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / EVENTS_FILE).write_text("")
    assert cli.main(["report", str(tmp_path)]) == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "cannot report" in err and REPORT_FILE in err and EVENTS_FILE not in err
    assert not (tmp_path / HTML_FILE).exists()


# -- (3) the page in a real headless browser ------------------------------------------------------------------

BROWSER_TIMEOUT_S = 60


def _chromium() -> str | None:
    return shutil.which("chromium") or (str(Path("/usr/bin/chromium")) if Path("/usr/bin/chromium").exists()
                                        else None)


needs_chromium = pytest.mark.skipif(_chromium() is None, reason="Debian chromium not installed "
                                    "(CI installs it: apt-get install chromium)")


def _browse(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    chromium = _chromium()
    assert chromium is not None
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)


@pytest.fixture
def page(tmp_path: Path) -> Path:
    return write_report(_verdict_run(tmp_path / "run"))


@needs_chromium
def test_chromium_dom_has_the_plots_table_and_faults(tmp_path: Path, page: Path) -> None:
    res = _browse(tmp_path, "--dump-dom", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'id="eval-loss"' in res.stdout, res.stdout[:2000]
    dom = _Dom(res.stdout)
    _check_page(dom, faults=6)
    first = next(c for c, _ in dom.rows if c.startswith("invariant "))
    assert first == "invariant fail", "the browser shows a violated invariant first"


def _pixels_near(img: Image.Image, rgb: tuple[int, int, int], tol: int = 12) -> int:
    return sum(n for n, c in img.getcolors(maxcolors=1 << 24) or []
               if all(abs(int(a) - b) <= tol for a, b in zip(c[:3], rgb, strict=True)))


@needs_chromium
def test_chromium_renders_the_page(tmp_path: Path, page: Path) -> None:
    shot = tmp_path / "shot.png"
    res = _browse(tmp_path, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 2400)  # the verdicts come first: the timeline is further down
    assert len(img.getcolors(maxcolors=1 << 24) or []) > 200  # not blank: text, plots
    # the plots were decoded and painted, not just their boxes: the timeline's colors are on screen
    for state in ("training", "down", "frozen"):
        color = STATE_COLORS[state]
        rgb = (int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16))
        assert _pixels_near(img, rgb) > 200, state
