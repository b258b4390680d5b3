"""Tests for diloco_chaos/harness/testing/pytest_plugin.py, the diloco-chaos pytest plugin (entry point pytest11).

What: marker registration and -m / -k selection; the run deadline bounded by the test's timeout (as a pure
function, and once for real: a run that would go on for minutes stops at its lowered deadline and fails the
test with a message naming it, its processes stopped); the failure report section with the run directory and
figures, and the teardown hygiene check catching (and killing) a leaked process, on one real tiny run; the
`cluster` cache (one run per scenario per module) with a stand-in runner; the `toxiproxy` fixture; the
cross-process lock that serializes runs sharing one TOXIPROXY_URL server.

Why: every suite is written against this API, so a plugin that swallows a failure report, lets a hung run be
killed by pytest-timeout, or leaks a process into the next test breaks every suite at once.

Generated test files run under `pytester`: in-process for the quick ones (with pytest-timeout's thread method,
so the inner session never touches this test's SIGALRM timer), in a subprocess for the two real runs (the
plugin is then loaded through its entry point, as in a user's project). Two real runs in this file, ~10-15 s
each on two cores.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from diloco_chaos.chaos.toxiproxy_client import ToxiproxyClient, ToxiproxyError
from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.testing.pytest_plugin import (
    MARKERS,
    ChaosRun,
    _ServerLock,
    as_scenario,
    bound_deadline,
    hygiene_problems,
)

pytest_plugins = ["pytester"]

INNER = ("-p", "no:randomly", "-p", "no:cacheprovider", "-o", "timeout_method=thread")
TINY = {"name": "tiny-plugin", "seed": 1, "algorithm": "decoupled",
        "topology": {"learners": 1, "chips_per_learner": 1},
        "train": {"steps": 20, "warmup_steps": 2}, "eval": {"every_s": 5.0, "batches": 2},
        "links": {"proxy": "off"}}


# ----------------------------------------------------------------------------- markers and selection

MARKED = """
import pytest

@pytest.mark.failure
def test_kill_chip(): pass

@pytest.mark.failure
@pytest.mark.slow
def test_random_failures(): pass

@pytest.mark.link
def test_partition(): pass

@pytest.mark.straggler
def test_half_speed(): pass

@pytest.mark.syncer
def test_crash_restore(): pass

def test_plain(): pass
"""


@pytest.mark.parametrize(("args", "passed"), [
    (("-m", "failure"), 2),
    (("-m", "not slow"), 5),
    (("-m", "failure and not slow"), 1),
    (("-m", "link or straggler or syncer"), 3),
    (("-k", "link"), 1),  # marker names are keywords too
    (("-k", "syncer or straggler"), 2),
])
def test_markers_are_registered_and_select(pytester: pytest.Pytester, args: tuple[str, ...], passed: int) -> None:
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest(*INNER, "--strict-markers", *args)
    result.assert_outcomes(passed=passed, deselected=6 - passed)


def test_markers_and_fixtures_are_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*INNER, "--markers")
    result.stdout.fnmatch_lines([f"@pytest.mark.{name}: *" for name in MARKERS], consecutive=False)
    fixtures = pytester.runpytest(*INNER, "--fixtures")
    fixtures.stdout.fnmatch_lines(["run_scenario *", "cluster *", "toxiproxy *"], consecutive=False)


# ----------------------------------------------------------------------------- deadlines


def test_bound_deadline_lowers_run_s_only_when_the_test_timeout_is_nearer() -> None:
    sc = as_scenario(TINY)
    assert bound_deadline(sc, None, None, 30.0) is sc, "no test timeout: the scenario's own deadline"
    assert bound_deadline(sc, 2000.0, 2000.0, 30.0) is sc, "run_s (900) already ends before the timeout"
    lowered = bound_deadline(sc, 250.0, 300.0, 30.0)
    assert lowered.timeouts.run_s == 250.0 - 30.0 - 2 * sc.timeouts.shutdown_s
    assert lowered.timeouts.barrier_s == sc.timeouts.barrier_s and lowered.train == sc.train
    with pytest.raises(pytest.fail.Exception, match=r"barrier_s \+ gloo_s = 70 s .*@pytest.mark.timeout"):
        bound_deadline(sc, 90.0, 100.0, 30.0)  # 90 - 40 = 50 s left: below barrier_s + gloo_s


def test_run_budget_follows_marker_ini_and_plugin_presence(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_budget="""
        import pytest
        from diloco_chaos.harness.testing.pytest_plugin import run_budget

        @pytest.mark.timeout(50)
        def test_marker(request):
            left, timeout = run_budget(request.node)
            assert timeout == 50 and 45 < left <= 50

        def test_ini(request):
            left, timeout = run_budget(request.node)
            assert timeout == 40 and 35 < left <= 40
    """)
    pytester.runpytest(*INNER, "-o", "timeout=40").assert_outcomes(passed=2)
    pytester.makepyfile(test_budget="""
        from diloco_chaos.harness.testing.pytest_plugin import run_budget

        def test_none(request):
            assert run_budget(request.node) == (None, None)
    """)
    pytester.runpytest(*INNER, "-o", "timeout=0").assert_outcomes(passed=1)


HUNG = {**TINY, "name": "hung", "train": {"steps": 1_000_000, "warmup_steps": 2},
        "timeouts": {"connect_s": 1.0, "socket_op_s": 0.5, "heartbeat_s": 0.2, "liveness_s": 1.0, "gloo_s": 2.0,
                     "barrier_s": 3.0, "startup_s": 30.0, "shutdown_s": 0.5}}


def test_a_run_that_would_outlive_the_test_stops_at_its_own_deadline(pytester: pytest.Pytester) -> None:
    """Real run 1 of 2: a million steps under a 20 s test timeout. The plugin lowers timeouts.run_s (900 s) to
    20 - grace 5 - 2 x shutdown 0.5 = ~14 s; the supervisor stops every process there, and the test fails with
    ChaosRunFailed naming the deadline, not with pytest-timeout's interrupt. Teardown finds nothing left."""
    pytester.makepyfile(test_hung=f"""
        import pytest

        @pytest.mark.timeout(20)
        def test_hung(run_scenario):
            run_scenario({HUNG!r})
    """)
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-o", "chaos_grace_s=5", timeout=120)
    took = time.monotonic() - t0
    out = result.stdout.str()
    result.assert_outcomes(failed=1)  # no teardown error: hygiene found every process stopped
    assert "ChaosRunFailed" in out and "lowered from timeouts.run_s = 900 s to" in out, out[-3000:]
    assert "inside the test's timeout of 20 s" in out and "@pytest.mark.timeout(N)" in out
    assert "Timeout (>" not in out, "pytest-timeout fired: the run's own deadline should have come first"
    result.stdout.fnmatch_lines(["*- diloco-chaos runs (1) -*", "*hung (decoupled, 1x1, seed 1)  run_dir: *"])
    assert took < 60, took


# ----------------------------------------------------------------------------- failure report and hygiene


LEAKY = f"""
import subprocess, sys
import pytest

@pytest.mark.timeout(150)
def test_tiny_run_then_fails(run_scenario):
    leaked = []

    def on_events(events):  # a process born during the run, as a run's own would be
        if not leaked:
            leaked.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid)

    run = run_scenario({TINY!r}, on_events=on_events)
    run.pids.append(leaked[0])  # ... that the run forgot to stop
    assert run.report["merge_count"] > 0 and run.of("merge") and run.events
    run.check("model_finite")
    run.figures({{"answer": 42}}, merges=run.report["merge_count"])
    assert run.report["final_eval_loss"] < 0, "deliberate failure"
"""


def test_failure_report_section_and_teardown_hygiene_on_a_real_run(pytester: pytest.Pytester) -> None:
    """Real run 2 of 2: a tiny run (1 learner x 1 chip, 20 steps, no proxies) inside a test that fails. The
    failure shows the "diloco-chaos runs" section with the run dir, key figures and the test's own figures; a
    process of the run still alive at teardown fails the test again (HygieneError) and is killed. It runs
    with the options ci/user-workflow.yml gives (--chaos-keep-failed, --junitxml): the failed test's run is
    kept with its report.html, and the JUnit file records the failure."""
    pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--chaos-keep-failed", "kept",
                                           "--junitxml", "junit.xml", timeout=240)
    out = result.stdout.str()
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*AssertionError: deliberate failure*",
        "*- diloco-chaos runs (1) -*",
        "*[[]1] tiny-plugin (decoupled, 1x1, seed 1)  run_dir: *",
        "*final_eval_loss * | merge_count * | longest_gap_s * | goodput * | uptime * | faults_fired 0/0 | wall_s *",
        '*figures: {"answer": 42, "merges": *}*',
    ], consecutive=False)
    assert "model_finite: ok" in out, "check() prints the invariant's figure into the test output"
    run_dir = Path(re.search(r"run_dir: (\S+)", out).group(1))
    assert (run_dir / "report.json").is_file() and (run_dir / EVENTS_FILE).is_file()
    assert run_dir.is_relative_to(pytester.path), "runs live under the test's own tmp_path"
    m = re.search(r"HygieneError: run 'tiny-plugin' left processes \[(\d+)\] \(killed now\) and ports still "
                  r"listening \[\]", out)
    assert m, out[-4000:]
    pid = int(m.group(1))
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert out.count("diloco-chaos runs (1)") == 2, "the teardown error carries the section too"
    kept = sorted((pytester.path / "kept").glob("*/*/report.html"))
    assert kept and kept[0].parent.name == run_dir.name, out[-2000:]
    assert (kept[0].parent / "report.json").is_file() and "test_tiny_run_then_fails" in kept[0].parent.parent.name
    junit = (pytester.path / "junit.xml").read_text()
    assert "<failure" in junit and "test_tiny_run_then_fails" in junit


def _fake_run(tmp_path: Path, pids: list[int], ended_at: float) -> ChaosRun:
    EventLog(tmp_path / EVENTS_FILE, "supervisor").close()
    run = ChaosRun(from_dict(TINY), tmp_path, pids=pids, ended_at=ended_at)
    run.__dict__["report"] = {"chip_pids": []}
    return run


def test_hygiene_kills_what_the_run_left_but_not_a_reused_pid(tmp_path: Path) -> None:
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "a").mkdir()
        run = _fake_run(tmp_path / "a", [ours.pid], ended_at=time.time())
        (problem,) = hygiene_problems([run])
        assert f"left processes [{ours.pid}] (killed now)" in problem and str(run.run_dir) in problem
        ours.wait(timeout=10)  # already reaped by the hygiene check's wait: any status
        assert not psutil.pid_exists(ours.pid)
    finally:
        ours.kill()
    older = time.time() - 60  # "the run ended a minute ago": a process born since is someone else's
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "b").mkdir()
        assert hygiene_problems([_fake_run(tmp_path / "b", [other.pid], ended_at=older)]) == []
        assert other.poll() is None, "a process that is not the run's is never killed"
    finally:
        other.kill()
        other.wait(timeout=10)
    (tmp_path / "c").mkdir()
    assert hygiene_problems([_fake_run(tmp_path / "c", [], ended_at=time.time())]) == []


# ----------------------------------------------------------------------------- cluster


CLUSTER_CONFTEST = """
import json
import pytest
import diloco_chaos.harness.testing.pytest_plugin as plugin
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog

CALLS = []

@pytest.fixture(autouse=True)
def fake_runs(monkeypatch, tmp_path_factory):
    def execute(scenario, root, item, config, **kw):
        sc = plugin.as_scenario(scenario)
        CALLS.append((item.module.__name__, sc.name))
        d = tmp_path_factory.mktemp("fake")
        EventLog(d / EVENTS_FILE, "supervisor").close()
        run = plugin.ChaosRun(sc, d, ended_at=1.0)
        run.__dict__["report"] = {"chip_pids": [], "final_eval_loss": 2.5, "faults": []}
        plugin._remember(item, run)
        return run
    monkeypatch.setattr(plugin, "execute", execute)
    yield
    print("CALLS", json.dumps(CALLS))
"""

CLUSTER_TEST = """
TABLE = {table!r}

def test_one(cluster):
    assert cluster(TABLE).report["final_eval_loss"] == 2.5

def test_two(cluster):
    base = cluster(TABLE)
    assert base is cluster(dict(TABLE)), "an equal scenario is the same run"
    other = cluster(dict(TABLE, seed=2))
    assert other is not base
    assert {fail}
"""


def test_cluster_runs_each_scenario_once_per_module(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CLUSTER_CONFTEST)
    pytester.makepyfile(test_mod_a=CLUSTER_TEST.format(table=TINY, fail="True"),
                        test_mod_b=CLUSTER_TEST.format(table=TINY, fail="False, 'deliberate'"))
    result = pytester.runpytest(*INNER, "-s")
    result.assert_outcomes(passed=3, failed=1)
    calls = re.findall(r"CALLS (\[.*\])", result.stdout.str())[-1]
    assert calls == ('[["test_mod_a", "tiny-plugin"], ["test_mod_a", "tiny-plugin"], '
                     '["test_mod_b", "tiny-plugin"], ["test_mod_b", "tiny-plugin"]]'), calls
    # test_mod_b::test_two failed: its report lists both runs it used, the shared one and its own
    result.stdout.fnmatch_lines(["*- diloco-chaos runs (2) -*", "[[]1] tiny-plugin (*seed 1)*",
                                 "[[]2] tiny-plugin (*seed 2)*"])
    result = pytester.runpytest(*INNER, "-s", "test_mod_a.py::test_two")
    result.assert_outcomes(passed=1)  # alone, in any order: nothing depends on another test having run


# ----------------------------------------------------------------------------- toxiproxy


def test_toxiproxy_fixture_serves_proxies_and_stops(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                    echo: str) -> None:
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    pytester.makepyfile(test_tp=f"""
        import socket

        def test_proxy(toxiproxy):
            assert toxiproxy.kind in ("embedded", "toxiproxy-server")
            info = toxiproxy.create_proxy("learner-0", {echo!r})
            with socket.create_connection(("127.0.0.1", info.listen_port), timeout=5) as s:
                s.sendall(b"ping")
                assert s.recv(4) == b"ping"
            print("URL", toxiproxy.url)
    """)
    result = pytester.runpytest(*INNER, "-s")
    result.assert_outcomes(passed=1)
    url = re.search(r"URL (http://\S+)", result.stdout.str()).group(1)
    with pytest.raises(ToxiproxyError):
        ToxiproxyClient(url, timeout_s=1.0).version()


LOCK_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held")
"""


def _probe(url: str) -> str:
    return subprocess.run([sys.executable, "-c", LOCK_PROBE, str(_ServerLock.path(url))], capture_output=True,
                          text=True, timeout=30, check=True).stdout.strip()


def test_shared_server_lock_is_exclusive_across_processes_and_reentrant_within_one() -> None:
    url = f"http://127.0.0.1:1/test-{time.monotonic_ns()}"
    assert _probe(url) == "free"
    with _ServerLock.hold(url, wait_s=5.0):
        with _ServerLock.hold(url + "/", wait_s=0.0):  # same server, same process: re-entrant, no wait
            assert _probe(url) == "held", "another xdist worker must wait"
        assert _probe(url) == "held", "still held by the outer holder"
    assert _probe(url) == "free"
    _ServerLock.path(url).unlink(missing_ok=True)


def test_the_user_workflow_only_uses_options_the_plugin_registers(pytester: pytest.Pytester) -> None:
    workflow = (Path(__file__).parents[2] / "ci" / "user-workflow.yml").read_text()
    used = set(re.findall(r"--chaos-[a-z-]+", workflow))
    assert used == {"--chaos-keep-failed"}
    helptext = pytester.runpytest(*INNER, "--help").stdout.str()
    assert all(opt in helptext for opt in used)
    assert "TOXIPROXY_URL" in workflow and "--junitxml" in workflow and "upload-artifact" in workflow


def test_failure_section_puts_unexpected_errors_first_and_labels_the_expected_ones(tmp_path: Path) -> None:
    run = _fake_run(tmp_path, [], ended_at=time.time())
    run.__dict__["report"] = {"chip_pids": [], "errors": [
        {"proc": "learner1.chip1", "ev": "chip_error", "error": "CollectiveFailed: Connection reset by peer",
         "t_s": 3.0, "expected": True, "cause": "fault 0: kill_chip(learner 1, chip=0)"},
        {"proc": "syncer", "ev": "syncer_error", "error": "KeyError: 'fragment'", "t_s": 4.0, "expected": False,
         "cause": None}]}
    lines = run.summary().splitlines()
    at = {name: i for i, ln in enumerate(lines) for name in ("UNEXPECTED errors (1)", "expected errors (1")
          if name in ln}
    assert at["UNEXPECTED errors (1)"] < at["expected errors (1"], lines
    assert "syncer syncer_error: KeyError: 'fragment'" in lines[at["UNEXPECTED errors (1)"] + 1]
    assert lines[at["expected errors (1"] + 1].endswith("[expected: fault 0: kill_chip(learner 1, chip=0)]")


def test_failure_section_lists_the_invariants_the_run_recorded_as_violated(tmp_path: Path) -> None:
    from diloco_chaos.harness.report.results import InvariantFigure
    from diloco_chaos.harness.run.rundir import INVARIANTS_FILE, write_json

    run = _fake_run(tmp_path, [], ended_at=time.time())
    run.__dict__["report"] = {"errors": []}
    assert not any("invariants" in ln for ln in run.summary().splitlines())  # none recorded: nothing said
    figures = [InvariantFigure("faults_fired", True, 1, 1, ">=", "", "faults fired", ""),
               InvariantFigure("pushes_received", False, 15, 0, "<=", "", "pushes never logged", "15 of 120")]
    write_json(run.run_dir / INVARIANTS_FILE, {"schema_version": 1,
                                               "invariants": [dataclasses.asdict(f) for f in figures]})
    lines = run.summary().splitlines()
    at = next(i for i, ln in enumerate(lines) if "invariants: 1 of 2 violated" in ln)
    assert lines[at + 1].strip() == "pushes_received violated: pushes never logged 15 > bound 0 (15 of 120)", lines
