"""The diloco-chaos pytest plugin: fixtures, markers, timeouts and failure reports for chaos suites.

What: a chaos test is "build a cluster from a scenario, run it on real processes, assert on what it left
behind". This plugin (entry point ``pytest11``, so it is active wherever diloco-chaos is installed) gives
every suite, ours in ``suites/`` and a user's own, the same few pieces:

* ``run_scenario`` fixture: ``run(scenario) -> ChaosRun``. Validates the scenario (a ``Scenario``, a table
  for ``diloco_chaos.harness.config.scenario.from_dict``, a ``.toml`` path or a built-in name), runs it in a directory
  of its own under the test's ``tmp_path``, records it for the failure report and, at teardown, fails the test if
  any process of the run is still alive or any of its ports still listens (and kills those processes, so
  the next test starts clean).
* ``cluster`` fixture: the same, but each distinct scenario runs at most once per test module and the
  result is shared (fault-free baselines several tests compare against). A test that uses it alone still
  works: no test depends on another having run first.
* ``toxiproxy`` fixture: a Toxiproxy server for one test (the same pick as a run's: ``TOXIPROXY_URL``,
  else ``toxiproxy-server`` on PATH, else the embedded server), stopped at teardown.
* markers ``failure``, ``link``, ``straggler``, ``syncer``, ``slow`` registered, so ``-m`` / ``-k`` select
  suites and ``--strict-markers`` accepts them.
* a report section "diloco-chaos runs" on every failed test that made runs: each run's directory and key
  figures (final eval loss, merges, longest gap, goodput, uptime, faults fired) and any figures the test
  printed with ``ChaosRun.figures``; with ``--chaos-keep-failed DIR`` those run directories are also copied
  to ``DIR`` with their HTML reports (diloco_chaos/harness/testing/failed_runs.py), for CI to upload.

Why: the suites used to repeat the same boilerplate (from_dict, run_scenario(sc, tmp_path), leftovers()
asserts, print(figures)), and a failure in a 60-second run said nothing about where its run directory was.

Timeout hierarchy: the test's timeout (pytest-timeout: ``@pytest.mark.timeout(N)``, ``--timeout``,
``PYTEST_TIMEOUT`` or the ``timeout`` ini value) bounds everything. Each run's own deadline,
``timeouts.run_s``, is lowered when needed so that it ends ``chaos_grace_s`` (ini, default
``DEFAULT_GRACE_S``) plus twice ``timeouts.shutdown_s`` before the test's timeout would fire, counted from
the start of the test (or of its call phase under ``timeout_func_only``). So a hung run is stopped by its
own supervisor (every process SIGTERMed then SIGKILLed, links and proxies removed) and the test fails with
``ChaosRunFailed`` naming the deadline and how to raise it, instead of pytest-timeout interrupting the run
(or, with ``timeout_method = thread``, ending the whole pytest process). The grace covers the run's
shutdown, its final evaluation and the hygiene check. A timeout too short for the scenario's own timeout
hierarchy (``barrier_s + gloo_s < run_s``) fails the test before anything starts.

Parallel suites (pytest-xdist, ``-n 2``): every run directory is under the worker's own ``tmp_path``;
every port a run binds is ephemeral (the Gloo TCPStore and the syncer bind port 0, proxies listen on
127.0.0.1:0, a Toxiproxy server the run starts takes a free port with retries); a run without
``TOXIPROXY_URL`` starts its own Toxiproxy server, so the fixed proxy names ``learner-<i>`` never meet
another run's. With ``TOXIPROXY_URL`` set, every run and ``toxiproxy`` fixture on that shared server
would create the same ``learner-<i>`` names, so they take an exclusive lock per server URL (a file lock
in the temp directory, shared by all workers): such tests run one at a time, others go on in parallel.
``cluster`` caches per module per worker: use ``--dist loadfile`` (or ``loadscope``) so a module's
baseline runs once rather than once per worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from diloco_chaos.harness.chaos_run import INVARIANTS, ChaosRun, ChaosRunFailed, HygieneError
from diloco_chaos.harness.config.scenario import Scenario, builtin, from_dict, load
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.hosts.toxiproxy_lock import LOCK_POLL_S, ToxiproxyServer, _ServerLock, _shared_url

MARKERS = {
    "failure": "process failure chaos: chips, learners or hosts killed or frozen for real (SIGKILL/SIGSTOP)",
    "link": "link chaos: faults on learner<->syncer links through their Toxiproxy proxies",
    "straggler": "mixed-speed learners: learners held to a speed profile",
    "syncer": "syncer failure and recovery (crash, restore from its checkpoint)",
    "slow": "long real-process runs (tens of seconds or more); deselect with -m 'not slow'",
}
DEFAULT_GRACE_S = 30.0
"""Seconds kept between a run's deadline and the test's timeout, besides 2 x timeouts.shutdown_s: the run's
shutdown, its final evaluation of the global model and report, and the hygiene check."""
SECTION = "diloco-chaos runs"
_START = pytest.StashKey[float]()
_CALL_START = pytest.StashKey[float]()
_RUNS = pytest.StashKey[list["ChaosRun"]]()


__all__ = ["DEFAULT_GRACE_S", "INVARIANTS", "LOCK_POLL_S", "MARKERS", "SECTION", "ChaosRun", "ChaosRunFailed",
           "HygieneError", "RunScenario", "ToxiproxyServer", "as_scenario", "bound_deadline", "cluster", "execute",
           "hygiene_problems", "run_budget", "run_scenario", "toxiproxy", "wait_for"]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `predicate` (what a run writes: a file, an event, a process list) until it returns a true value,
    which is returned; AssertionError naming `what` after `timeout` seconds. For tests and suites that watch a
    run from outside, where there is nothing to wait on but its files."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        tick.wait(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# -- scenarios and deadlines ------------------------------------------------------------------------------

def as_scenario(scenario: Scenario | Mapping[str, Any] | str | os.PathLike[str], name: str | None = None) -> Scenario:
    """A validated Scenario from a Scenario, a table (from_dict), a .toml path (load) or a built-in name.
    `name` replaces the scenario's name (it names the run directory and the report lines)."""
    if isinstance(scenario, Scenario):
        sc = scenario
    elif isinstance(scenario, Mapping):
        sc = from_dict(dict(scenario))
    elif isinstance(scenario, os.PathLike) or str(scenario).endswith(".toml"):
        sc = load(scenario)
    elif isinstance(scenario, str):
        sc = builtin(scenario)
    else:
        raise TypeError(f"a scenario is a Scenario, a table, a .toml path or a built-in name, not {scenario!r}")
    return sc.replace(name=name) if name is not None and name != sc.name else sc


def item_timeout(item: pytest.Item) -> tuple[float | None, bool]:
    """(seconds, func_only) of the item's pytest-timeout timeout; (None, False) when there is none."""
    config = item.config
    if not config.pluginmanager.hasplugin("timeout"):
        return None, False
    value: Any = None
    func_only: Any = None
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        func_only = marker.kwargs.get("func_only")
    if value is None:
        value = config.getoption("timeout", None)
    if value is None:
        value = os.environ.get("PYTEST_TIMEOUT") or None
    if value is None:
        value = config.getini("timeout") or None
    if func_only is None:
        func_only = bool(config.getini("timeout_func_only"))
    seconds = float(value) if value is not None else 0.0
    return (seconds if seconds > 0 else None), bool(func_only)


def run_budget(item: pytest.Item | None) -> tuple[float | None, float | None]:
    """(seconds left before the item's test timeout fires, that timeout); (None, None) when unbounded."""
    if item is None:
        return None, None
    timeout, func_only = item_timeout(item)
    if timeout is None:
        return None, None
    start = item.stash.get(_CALL_START if func_only else _START, None)
    if start is None:  # func_only and still in setup: the timer is not running yet
        return None, timeout
    return timeout - (time.monotonic() - start), timeout


def grace_s(config: pytest.Config) -> float:
    raw = config.getini("chaos_grace_s")
    return float(raw) if raw not in (None, "") else DEFAULT_GRACE_S


def bound_deadline(sc: Scenario, left_s: float | None, timeout_s: float | None, grace: float) -> Scenario:
    """`sc` with timeouts.run_s lowered, if needed, to end `grace + 2 x shutdown_s` before the test's timeout
    (`left_s` seconds from now). Fails the test when that leaves too little for the scenario's timeouts."""
    if left_s is None:
        return sc
    t = sc.timeouts
    budget = left_s - grace - 2 * t.shutdown_s
    if t.run_s <= budget:
        return sc
    why = (f"the test's timeout of {timeout_s:g} s (pytest-timeout) leaves {left_s:.1f} s, of which "
           f"{grace + 2 * t.shutdown_s:g} s are kept for shutdown and reporting (chaos_grace_s + 2 x "
           f"timeouts.shutdown_s)")
    floor = max(t.barrier_s, t.barrier_s + t.gloo_s) + 1.0
    if budget < floor:
        pytest.fail(f"scenario {sc.name!r} cannot run: {why}, which is below what its timeouts need "
                    f"(timeouts.barrier_s + gloo_s = {t.barrier_s + t.gloo_s:g} s < run_s); raise the test's "
                    "timeout with @pytest.mark.timeout(N) or lower those timeouts", pytrace=False)
    try:
        return sc.replace(timeouts=dataclasses.replace(t, run_s=round(budget, 1)))
    except ScenarioError as e:
        pytest.fail(f"scenario {sc.name!r} cannot run: {why}; lowering timeouts.run_s to it fails validation: "
                    f"{e}", pytrace=False)


# -- running --------------------------------------------------------------------------------------------

def _remember(item: pytest.Item | None, run: ChaosRun) -> None:
    if item is None:
        return
    runs = item.stash.setdefault(_RUNS, [])
    if run not in runs:
        runs.append(run)


def execute(scenario: Any, root: Path, item: pytest.Item | None, config: pytest.Config, *, name: str | None = None,
            on_events: Callable[[list[dict[str, Any]]], None] | None = None,
            toxiproxy: ToxiproxyServer | None = None, sink: list[ChaosRun] | None = None) -> ChaosRun:
    """Run a scenario for `item` under `root`: the deadline bounded by the test's timeout, a shared Toxiproxy
    server held exclusively, the run recorded for the failure report (and appended to `sink` as soon as it
    starts, so that its hygiene is checked however it ends). Raises ChaosRunFailed."""
    from diloco_chaos.harness.targets.base import supervisor_for

    sc = as_scenario(scenario, name)
    if toxiproxy is not None and sc.links.proxy != "auto":
        raise ValueError(f"run {sc.name!r}: toxiproxy= needs links.proxy = 'auto', not {sc.links.proxy!r}")
    with contextlib.ExitStack() as stack:
        url = toxiproxy.url if toxiproxy is not None else _shared_url(sc)
        if url is not None:
            left, _ = run_budget(item)
            stack.enter_context(_ServerLock.hold(url, None if left is None else left - grace_s(config)))
        if toxiproxy is not None:
            stack.enter_context(_environ("TOXIPROXY_URL", toxiproxy.url))
        left, timeout = run_budget(item)
        bounded = bound_deadline(sc, left, timeout, grace_s(config))
        sup = supervisor_for(bounded, root, on_events)
        run = ChaosRun(bounded, sup.run_dir,
                       bounded_from_s=sc.timeouts.run_s if bounded is not sc else None)
        _remember(item, run)
        if sink is not None:
            sink.append(run)
        try:
            result = sup.run()
        except Exception as e:  # noqa: BLE001 - re-raised with the run's directory and deadline
            run.error = e
            raise ChaosRunFailed(_failure_message(run, e, timeout), run, e) from e
        finally:  # also on pytest-timeout's interrupt or Ctrl-C: teardown still checks these pids
            run.pids = [p.pid for p in [*sup.procs.values(), *sup.retired]]
            run.ended_at = time.time()
        run.__dict__["report"] = result.report
        return run


def _failure_message(run: ChaosRun, e: BaseException, timeout: float | None) -> str:
    msg = f"run {run.name!r} failed: {type(e).__name__}: {e}"
    if run.bounded_from_s is not None and "timeouts.run_s" in str(e):
        msg += (f". Its deadline was lowered from timeouts.run_s = {run.bounded_from_s:g} s to "
                f"{run.scenario.timeouts.run_s:g} s to end inside the test's timeout of {timeout:g} s "
                "(pytest-timeout): every process was stopped; if the run needs longer, raise the test's timeout "
                "with @pytest.mark.timeout(N)")
    return f"{msg}. Run dir: {run.run_dir}"


@contextlib.contextmanager
def _environ(key: str, value: str) -> Iterator[None]:
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def hygiene_problems(runs: list[ChaosRun], kill: bool = True) -> list[str]:
    """One line per run that left a process alive or a port listening; with `kill`, SIGKILLs those processes
    (and their children) so later tests start clean. A process created after the run ended is not its own
    (a reused pid) and is left alone."""
    problems = []
    for run in runs:
        left = run.leftovers()
        procs = [p for p in left["processes"] if _created_before(p, run.ended_at)]
        if not procs and not left["ports"]:
            continue
        if kill:
            for pid in procs:
                _kill_tree(pid)
        problems.append(f"run {run.name!r} left processes {procs}{' (killed now)' if kill and procs else ''} "
                        f"and ports still listening {left['ports']}; run dir: {run.run_dir}")
    return problems


def _created_before(pid: int, t: float) -> bool:
    try:
        return t <= 0 or psutil.Process(pid).create_time() <= t + 1.0
    except psutil.NoSuchProcess:
        return False


def _kill_tree(pid: int) -> None:
    try:
        proc = psutil.Process(pid)
        family = [*proc.children(recursive=True), proc]
    except psutil.NoSuchProcess:
        return
    for q in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            q.send_signal(signal.SIGKILL)
    psutil.wait_procs(family, timeout=5)


class RunScenario:
    """The callable the `run_scenario` fixture returns; `.runs` holds this test's runs in order."""

    def __init__(self, item: pytest.Item, root: Path) -> None:
        self.item = item
        self.root = root
        self.runs: list[ChaosRun] = []

    def __call__(self, scenario: Scenario | Mapping[str, Any] | str | os.PathLike[str], name: str | None = None, *,
                 on_events: Callable[[list[dict[str, Any]]], None] | None = None,
                 toxiproxy: ToxiproxyServer | None = None) -> ChaosRun:
        """Validate and run `scenario`; returns the finished ChaosRun, raises ChaosRunFailed (`.run` set)."""
        return execute(scenario, self.root, self.item, self.item.config, name=name, on_events=on_events,
                       toxiproxy=toxiproxy, sink=self.runs)


# -- fixtures ---------------------------------------------------------------------------------------------

@pytest.fixture
def run_scenario(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunScenario]:
    """`run(scenario, name=None, *, on_events=None, toxiproxy=None) -> ChaosRun`: run a scenario (Scenario,
    table, .toml path or built-in name) on real processes in a directory under this test's tmp_path. At
    teardown the test fails with HygieneError if any of its runs left a process or a listening port."""
    runner = RunScenario(request.node, tmp_path / "runs")
    yield runner
    problems = hygiene_problems(runner.runs)
    if problems:
        raise HygieneError("; ".join(problems))


@dataclass
class _Cached:
    run: ChaosRun | None = None
    error: BaseException | None = None


@pytest.fixture(scope="module")
def _chaos_cluster_cache() -> dict[str, _Cached]:
    return {}


@pytest.fixture
def cluster(request: pytest.FixtureRequest, _chaos_cluster_cache: dict[str, _Cached],
            tmp_path_factory: pytest.TempPathFactory) -> Callable[..., ChaosRun]:
    """`cluster(scenario, name=None) -> ChaosRun`: like `run_scenario`, but a scenario runs at most once per
    test module (per xdist worker) and later calls with an equal scenario get the same ChaosRun. Hygiene is
    checked right after the run; a run that failed, or left something behind, fails every test asking for
    it, without running again. For shared baselines (fault-free runs several tests compare against)."""
    item = request.node

    def get(scenario: Scenario | Mapping[str, Any] | str | os.PathLike[str], name: str | None = None) -> ChaosRun:
        sc = as_scenario(scenario, name)
        key = json.dumps(sc.to_dict(), sort_keys=True, default=str)
        entry = _chaos_cluster_cache.get(key)
        if entry is None:
            entry = _chaos_cluster_cache[key] = _Cached()
            root = tmp_path_factory.mktemp(f"cluster-{sc.name}", numbered=True)
            try:
                entry.run = execute(sc, root, item, item.config)
                problems = hygiene_problems([entry.run])
                if problems:
                    entry.error = HygieneError("; ".join(problems))
            except ChaosRunFailed as e:
                entry.run, entry.error = e.run, e
        if entry.run is not None:
            _remember(item, entry.run)
        err = entry.error
        if isinstance(err, ChaosRunFailed):
            raise ChaosRunFailed(f"shared run (cluster): {err}", err.run, err.cause)
        if err is not None:
            raise HygieneError(f"shared run (cluster): {err}")
        assert entry.run is not None
        return entry.run

    return get


@pytest.fixture
def toxiproxy(request: pytest.FixtureRequest) -> Iterator[ToxiproxyServer]:
    """A Toxiproxy server for this test: TOXIPROXY_URL (held exclusively, see the module doc), else
    toxiproxy-server on PATH, else the embedded server, started on a free port and stopped at teardown.
    Proxies the test created are removed at teardown. Pass it to `run_scenario(..., toxiproxy=it)` to put a
    run's links on it."""
    from diloco_chaos.chaos.toxiproxy_backend import start_backend
    from diloco_chaos.chaos.toxiproxy_client import ToxiproxyClient

    with contextlib.ExitStack() as stack:
        shared = os.environ.get("TOXIPROXY_URL")
        if shared:
            left, _ = run_budget(request.node)
            stack.enter_context(_ServerLock.hold(shared, None if left is None else left - grace_s(request.config)))
        backend = start_backend("auto", seed=0, ready_s=30.0, http_timeout_s=5.0)
        stack.callback(backend.stop, 10.0)
        client = ToxiproxyClient(backend.url, timeout_s=5.0)
        before = set(client.proxies())
        server = ToxiproxyServer(backend.url, backend.kind, backend.version, client)
        yield server
        for proxy in set(client.proxies()) - before:
            client.delete_proxy(proxy, missing_ok=True)


# -- hooks ------------------------------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--chaos-keep-failed", metavar="DIR", default=None,
                     help="copy the run directories of failed tests to DIR/<test>/<run>, each with its "
                          "report.html (for CI artifacts)")
    parser.addini("chaos_grace_s", "seconds a diloco-chaos run's deadline keeps before the test's timeout, "
                  f"besides 2 x timeouts.shutdown_s (default {DEFAULT_GRACE_S:g})", default=str(DEFAULT_GRACE_S))


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    item.stash[_START] = time.monotonic()
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    item.stash[_CALL_START] = time.monotonic()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome: Any = yield
    report = outcome.get_result()
    runs = item.stash.get(_RUNS, [])
    if not report.failed or not runs:
        return
    text = "\n".join(f"[{i}] {run.summary()}" for i, run in enumerate(runs, 1))
    keep = item.config.getoption("--chaos-keep-failed", None)
    if keep:
        from diloco_chaos.harness.testing.failed_runs import keep_failed

        kept = keep_failed(keep, item.nodeid, [run.run_dir for run in runs])
        text += "\n" + "\n".join(f"kept: {path} (report.html inside)" for path in kept)
    title = f"{SECTION} ({len(runs)})"
    longrepr = report.longrepr
    if hasattr(longrepr, "addsection"):
        longrepr.addsection(title, text)
    else:
        report.sections.append((title, text))
