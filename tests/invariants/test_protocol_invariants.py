"""Protocol invariants (diloco_chaos/harness/invariants/protocol.py) over hand-built event logs: each holds on a good
log and fails, naming its figure and bound, on a log with the fault it exists to catch."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from conftest import complete

from diloco_chaos.harness.invariants import load_run
from diloco_chaos.harness.invariants.protocol import (
    PROTOCOL_INVARIANTS,
    apply_schedule,
    check_protocol,
    expected_weights,
    initial_pull,
    outer_lr,
    pushes_received,
    rda_norms,
    token_weights,
)
from diloco_chaos.harness.record.learner import InitialPull
from diloco_chaos.harness.testing.pytest_plugin import INVARIANTS
from diloco_chaos.trainers.config import DilocoConfig
from tests.invariants.test_invariants import P, config, decoupled_log, ev, holds, violated, write_run

LR = DilocoConfig().outer_lr
"""The outer lr the logs below were written with: the config's default (the test config sets none)."""

TAU = 2
"""diloco.overlap of the hand-built runs (config() leaves it at its default)."""


def with_protocol_facts(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A decoupled log (test_invariants.decoupled_log) with the facts the protocol invariants read, all consistent:
    every merge's weights (c_tokens^2 / c_steps), norms (RDA: merged = radial) and effective outer lr; a push_sent
    by the learner's link just before each push the syncer logged; and an apply of every merge that is not the
    final drain, arrived at the step after the pull and applied at pulled + tau."""
    out = []
    for e in evs:
        e = copy.deepcopy(e)
        if e["ev"] == "push":
            out.append(ev("push_sent", e["t"] - 0.001, f"learner{e['learner']}.link", learner=e["learner"],
                          fragment=e["fragment"], first_step=e["first_step"], last_step=e["last_step"],
                          c_steps=e["c_steps"], round=e["round"], bytes=1000, seconds=0.001))
        if e["ev"] == "merge":
            e.update(weights=[round(w, 6) for w in expected_weights(e["c_steps"], e["c_tokens"])], outer_lr=LR,
                     norms={"radial": 0.5, "merged": 0.5, "embedding_radial": 0.2, "embedding_merged": 0.15})
            for m, (_, last) in zip(e["participants"], e["step_ranges"], strict=True):
                if last + TAU <= 8:
                    out.append(ev("apply", e["t"] + 0.3, f"learner{m}.chip0", learner=m, step=last + TAU,
                                  fragments=[e["fragment"]], versions=[e["version"]], pulled=[last],
                                  arrived=[last + 1]))
        out.append(e)
    return out


def good() -> list[dict[str, Any]]:
    return with_protocol_facts(decoupled_log())


def first(evs: list[dict[str, Any]], kind: str, **match: Any) -> dict[str, Any]:
    return next(e for e in evs if e["ev"] == kind and all(e.get(k) == v for k, v in match.items()))


def test_registry_reaches_every_protocol_invariant_by_name(tmp_path: Path) -> None:
    assert set(PROTOCOL_INVARIANTS) <= set(INVARIANTS)
    results = check_protocol(write_run(tmp_path, complete(good())))  # whole steps: work_kept reads them
    assert [r.name for r in results] == list(PROTOCOL_INVARIANTS)
    assert all(r.ok for r in results), [r.message() for r in results if not r.ok]
    ddp = [ev("merge", 1.0, participants=[0, 1], step=1)]
    assert check_protocol(write_run(tmp_path, ddp, cfg=config("ddp"), name="ddp")) == []


def test_rda_norms(tmp_path: Path) -> None:
    res = holds(rda_norms(write_run(tmp_path, good(), name="a")))
    assert "2 participants" not in res.detail and "with two or more participants" in res.detail
    evs = good()
    first(evs, "merge", fragment=0)["norms"]["merged"] = 0.4  # a mean: shorter than the mean of the norms
    violated(rda_norms(write_run(tmp_path, evs, name="b")), "relative deviation of merged norm from radial norm 0.2",
             "> bound 0.001", "fragment 0 v1 (2 participants): merged 0.4 vs radial 0.5")
    mean_cfg = config()
    mean_cfg["diloco"]["merge_rule"] = "mean"
    holds(rda_norms(write_run(tmp_path, evs, cfg=mean_cfg, name="c")))  # a mean may shrink it ...
    first(evs, "merge", fragment=1)["norms"]["embedding_merged"] = 0.3  # ... but never exceed the mean norm
    violated(rda_norms(write_run(tmp_path, evs, cfg=mean_cfg, name="d")), "0.5 > bound 0.001")
    del first(evs, "merge", fragment=0)["norms"]
    violated(rda_norms(write_run(tmp_path, evs, name="e")), "n/a", "1 of 5 merges logged no norms")


def test_outer_lr(tmp_path: Path) -> None:
    holds(outer_lr(write_run(tmp_path, good(), name="a")))
    evs = good()
    first(evs, "merge", fragment=1)["outer_lr"] = LR / 2
    violated(outer_lr(write_run(tmp_path, evs, name="b")), "starting momentum 0.5 > bound 0.01",
             f"fragment 1 v1: effective lr {LR / 2:g}")
    first(evs, "merge", fragment=1)["outer_lr"] = float("nan")  # a zero direction: nothing to measure
    assert "1 with a zero direction skipped" in holds(outer_lr(write_run(tmp_path, evs, name="c"))).detail


def with_momentum(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every merge with the norms of its fragment's outer momentum before and after its step, carried over: each
    step starts from what the fragment's previous step left (0 before its first)."""
    left: dict[int, float] = {}
    for e in evs:
        if e["ev"] == "merge":
            p = e["fragment"]
            e["norms"] = {**e.get("norms", {}), "momentum_in": left.get(p, 0.0),
                          "momentum_out": left.get(p, 0.0) * 0.9 + 1.0 + p}
            left[p] = e["norms"]["momentum_out"]
    return evs


def test_outer_lr_checks_that_each_step_starts_from_the_momentum_the_previous_one_left(tmp_path: Path) -> None:
    """A restored syncer that dropped a fragment's outer momentum (mutation restore_drops_momentum) starts its next
    step of that fragment from 0, not from what the merge before the crash left: outer_lr fails naming it. A
    restore that loaded the same version with its momentum holds; one that loaded another version (a merge it
    checkpointed but never logged) is not compared."""
    evs = with_momentum(good())
    res = holds(outer_lr(write_run(tmp_path, evs, name="a")))
    assert "momentum carried over in 5 steps" in res.detail, res.detail
    second = [e for e in evs if e["ev"] == "merge" and e["fragment"] == 0][1]
    restore = ev("syncer_restore", second["t"] - 0.01, fragments=[0, 1], versions=[second["version"] - 1, 2],
                 merges=2, clock=4, tokens_merged=0.0, digests={}, merged_into={})
    holds(outer_lr(write_run(tmp_path, sorted([*evs, restore], key=lambda e: e["t"]), name="b")))
    dropped = copy.deepcopy(evs)
    [e for e in dropped if e["ev"] == "merge" and e["fragment"] == 0][1]["norms"]["momentum_in"] = 0.0
    violated(outer_lr(write_run(tmp_path, sorted([*dropped, restore], key=lambda e: e["t"]), name="c")),
             "starting momentum 1 > bound 0.01",
             f"fragment 0 v{second['version']}: its step started from momentum norm 0 after a syncer restore, "
             "the previous step of the fragment left 1")
    other = {**restore, "versions": [second["version"], 2]}  # checkpointed a merge the log does not show
    res = holds(outer_lr(write_run(tmp_path, sorted([*dropped, other], key=lambda e: e["t"]), name="d")))
    assert "(1 after a restore of another version, not compared)" in res.detail, res.detail


def test_token_weights(tmp_path: Path) -> None:
    evs = good()
    m = first(evs, "merge", fragment=0, version=2)
    m["c_steps"], m["c_tokens"], m["weights"] = [3, 1], [300, 100], [0.75, 0.25]  # 300^2/3 : 100^2/1 = 3 : 1
    res = holds(token_weights(write_run(tmp_path, evs, name="a")))
    assert "1 whose counters give unequal weights" in res.detail
    m["weights"] = [0.5, 0.5]  # uniform: the counters ignored
    violated(token_weights(write_run(tmp_path, evs, name="b")), "merge-weight difference 0.25 > bound 1e-05",
             "weights [0.5, 0.5], c_steps [3, 1], c_tokens [300, 100] give [0.75, 0.25]")
    off = config()
    off["diloco"]["token_weighting"] = False
    holds(token_weights(write_run(tmp_path, evs, cfg=off, name="c")))


def test_pushes_received(tmp_path: Path) -> None:
    res = holds(pushes_received(write_run(tmp_path, good(), name="a")))
    assert res.detail == "10 pushes sent, all logged by the syncer"
    evs = good()
    gone = first(evs, "push", learner=1, fragment=0, last_step=4)
    evs.remove(gone)  # the syncer dropped it without a word; the connection later ended in BYE
    for e in evs:  # (and its merge did not take it in)
        if e["ev"] == "merge" and e["fragment"] == 0 and e["version"] == 1:
            for key in ("participants", "c_steps", "c_tokens", "step_ranges", "base_versions", "weights"):
                del e[key][1]
    violated(pushes_received(write_run(tmp_path, evs, name="b")), "never logged by the syncer 1 > bound 0",
             "learner 1 fragment 0 steps 1-4 (round 1)", "ended in BYE")
    lost = evs + complete([ev("learner_down", gone["t"] + 0.01, "supervisor", learner=1, step=4)])
    res = holds(pushes_received(write_run(tmp_path, lost, name="c")))  # lost with its connection
    assert "1 lost with their connection" in res.detail
    bye = first(evs, "learner_bye", learner=1)
    late = good() + [ev("push_sent", bye["t"] + 0.001, "learner1.link", learner=1, fragment=0, first_step=5,
                     last_step=8, c_steps=4, round=3, bytes=1000, seconds=0.001)]  # sent after the BYE
    assert "1 sent after the learner's BYE" in holds(pushes_received(write_run(tmp_path, late, name="f"))).detail
    closed = evs + [ev("link_down", gone["t"] + 0.01, "learner1.link", learner=1, reason="closed")]
    violated(pushes_received(write_run(tmp_path, closed, name="d")), "1 > bound 0")  # a close is no excuse
    # a connection that ended while the push was being written (its link_down logged before the push_sent that
    # closes the write) may have taken it: lost with its connection; one that ended before the write began is not
    sent = first(evs, "push_sent", learner=1, fragment=0, last_step=4)
    sent["seconds"] = 0.02
    during = evs + [ev("link_down", sent["t"] - 0.01, "learner1.link", learner=1, reason="ConnectionClosed")]
    assert "1 lost with their connection" in holds(pushes_received(write_run(tmp_path, during, name="g"))).detail
    before = evs + [ev("link_down", sent["t"] - 0.03, "learner1.link", learner=1, reason="ConnectionClosed")]
    violated(pushes_received(write_run(tmp_path, before, name="h")), "1 > bound 0")
    no_sent = [e for e in good() if e["ev"] != "push_sent"]
    violated(pushes_received(write_run(tmp_path, no_sent, name="e")), "n/a", "no link logged push_sent")


def test_apply_schedule(tmp_path: Path) -> None:
    res = holds(apply_schedule(write_run(tmp_path, complete(good()), name="a")))
    # arrived + 1 = pulled + tau: either bound gives the same step (with tau = 2 a value never arrives sooner)
    assert res.detail == "6 applied fragments on schedule, 0 of them due by pulled + tau rather than on arrival"
    evs = good()
    a = first(evs, "apply", learner=0, fragments=[1])
    a["step"] += 1  # tau + 1
    violated(apply_schedule(write_run(tmp_path, complete(evs), name="b")), "applies off the tau schedule 1 > bound 0",
             f"learner 0 applied fragment 1 v1 after step {a['step']}, due after {a['step'] - 1} (pulled at 2, "
             "arrived at 3, tau 2)")
    held = evs + [ev("regroup", a["t"] - 0.1, "learner0.chip0", learner=0, step=a["step"] - 1)]
    holds(apply_schedule(write_run(tmp_path, complete(held), name="c")))  # a regroup of its chips held it back
    a["step"] -= 2  # before pulled + tau: early
    violated(apply_schedule(write_run(tmp_path, complete(held), name="d")), "1 > bound 0", "due after 4")
    late = good()
    b = first(late, "apply", learner=1, fragments=[0])
    b["pulled"], b["arrived"] = [None], [b["step"] - 1]  # a value it did not pull: applied on arrival
    holds(apply_schedule(write_run(tmp_path, complete(late), name="e")))
    del b["arrived"]
    violated(apply_schedule(write_run(tmp_path, complete(late), name="f")), "n/a", "without pulled / arrived")


def restart_log(pull: dict[str, Any] | None, step_back: bool = True) -> list[dict[str, Any]]:
    evs = good()
    evs += [ev("learner_down", 3.0, "supervisor", learner=1, step=4, repair_s=0.5),
            ev("learner_restart", 3.5, "supervisor", learner=1, generation=1, start_step=4),
            ev("learner_join", 3.7, learner=1, peer="x", alive=[0, 1], versions=[2, 1])]
    if pull is not None:
        evs.append(ev("initial_pull", 3.8, "learner1.chip0", learner=1, step=4, of=P, **pull))
    if step_back:
        evs.append(ev("step", 3.9, "learner1.chip0", learner=1, step=5, loss=3.0, tokens=100, chips=1))
    return evs


def test_initial_pull(tmp_path: Path) -> None:
    res = holds(initial_pull(write_run(tmp_path, complete(good()), name="a")))
    assert res.detail == "no learner was restarted past step 0"
    full = {"fragments": 2, "applied": [[0, 2], [1, 1]]}
    holds(initial_pull(write_run(tmp_path, complete(restart_log(full)), name="b")))
    violated(initial_pull(write_run(tmp_path, complete(restart_log({"fragments": 0, "applied": []})), name="c")),
             "restarts without a complete initial pull 1 > bound 0", "initial pull applied 0 of 2 fragments")
    old = {"fragments": 2, "applied": [[0, 1], [1, 1]]}  # fragment 0 at a version older than it was sent
    violated(initial_pull(write_run(tmp_path, complete(restart_log(old)), name="d")), "1 > bound 0",
             "fragments [0] below the version sent on rejoin")
    violated(initial_pull(write_run(tmp_path, complete(restart_log(None)), name="e")),
             "stepped without an initial pull")
    holds(initial_pull(write_run(tmp_path, complete(restart_log(None, step_back=False)), name="f")))  # never came back
    assert load_run(write_run(tmp_path, complete(restart_log(full)), name="g")).records(InitialPull)
