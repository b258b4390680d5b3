"""The on-call incident of issue 26 (examples/incidents/: a host crash, a degraded WAN, a syncer OOM-kill), run
through the CLI: every fault's reaction is its own, and the terminal (live lines and final table),
events.jsonl, report.json and the HTML report give every fault the same start and end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diloco_chaos.harness.cli import main
from diloco_chaos.harness.record import RunLog
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.record.run import FaultEnd, FaultStart, RunStart
from diloco_chaos.harness.report.html import write_report
from diloco_chaos.harness.report.timeline import REACTIONS, concerns, fault_end_t

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "incidents"


def test_the_incident_runs_faults_have_their_own_reactions_and_one_start_and_end_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", str(EXAMPLES / "oncall-scenario.toml"), "--incident", str(EXAMPLES / "oncall.toml"),
               "--runs-dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    assert rc == 0, (err + out)[-4000:]
    run_dir = Path(re.search(r"^run directory: (\S+)$", out, re.M).group(1))  # type: ignore[union-attr]
    log = RunLog.load(run_dir / EVENTS_FILE)
    t0 = log.first(RunStart).t  # type: ignore[union-attr]
    starts = {e.index: e for e in log.of(FaultStart)}
    ends: dict[int, list[FaultEnd]] = {}
    for e in log.of(FaultEnd):
        ends.setdefault(e.index, []).append(e)
    assert sorted(starts) == sorted(ends) == [0, 1, 2], out[-3000:]
    assert all(len(v) == 1 for v in ends.values()), ends  # one end per fault
    # the kills ended at their recovery, not at the end of the run
    assert ends[0][0].reason != "end of run" and ends[0][0].ended_t is not None, ends[0]
    assert ends[2][0].reason == "until the syncer was restored", ends[2]

    # each reaction belongs to its fault: the record at start + detect_s concerns the fault's target
    report = json.loads((run_dir / "report.json").read_text())
    for row in report["fault_response"]:
        f = starts[row["index"]]
        if row["reaction"] is None:
            continue
        react = [e for e in log.records if e.ev == row["reaction"] and round(e.t - f.t, 3) == row["detect_s"]]
        assert react and all(e.ev in REACTIONS and concerns(f, e) for e in react), (row, react)
    by_index = {r["index"]: r for r in report["fault_response"]}
    assert by_index[2]["reaction"] == "syncer_down", by_index
    assert by_index[1]["reaction"] != "syncer_down" and by_index[0]["reaction"] != "syncer_down", by_index

    # one start and one end per fault, everywhere
    write_report(run_dir)
    page = (run_dir / "report.html").read_text()
    faults = {f["index"]: f for f in report["faults"]}
    live = err + out
    table = out[out.index("faults fired: 3"):]
    for i, f in starts.items():
        # seconds since run_start to the ms (as report.json writes them), then as each view formats them
        start, end = round(f.t - t0, 3), round(fault_end_t(ends[i][0]) - t0, 3)
        assert (faults[i]["start_s"], faults[i]["end_s"]) == (start, end), (faults[i], start, end)
        html_span = re.search(rf"F{i} [^<]*?: ([\d.]+) s to ([\d.]+) s", page)
        assert html_span is not None and html_span.groups() == (f"{start:.2f}", f"{end:.2f}"), html_span
        fired = re.search(rf"^\[ *([\d.]+)s\] fault F{i} fired", live, re.M)
        ended = re.search(rf"^\[ *([\d.]+)s\] fault F{i} ended", live, re.M)
        assert fired is not None and ended is not None, live[-4000:]
        assert (fired.group(1), ended.group(1)) == (f"{start:.1f}", f"{end:.1f}"), (i, start, end)
        row = re.search(rf"^  F{i} .* \| ([\d.]+)-([\d.]+) s \(", table, re.M)
        assert row is not None and row.groups() == (f"{start:.1f}", f"{end:.1f}"), table
