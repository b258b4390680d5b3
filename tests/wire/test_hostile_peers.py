"""A live syncer under hostile peers while real learners train: it stays up, merges, and leaks no connection.

A real tiny decoupled run (2 learners x 1 chip, real processes and sockets); once both learners joined, a
thread sends ~100 hostile frames (`diloco_chaos/harness/testing/hostile_peer.py`: every unauthenticated and
authenticated kind) straight to the syncer's port (`diloco_chaos/harness/testing/hostile_run.py`: the port from the
`syncer_start` event, the secret from the Supervisor that runs it). The authenticated attacks claim learner 1: each
replaces its real connection, which reconnects (a peer holding the secret is trusted as the learner it names); learner 0
is left alone.
"""

from __future__ import annotations

from conftest import tiny

from diloco_chaos.harness.testing.hostile_peer import PUSH_TOKENS
from diloco_chaos.harness.testing.hostile_run import ACCEPTED, run_under_attack
from tests.run.test_run_integration import assert_no_survivors

FRAMES = 100
STEPS = 150


def test_live_syncer_survives_hostile_peers(runs_dir) -> None:
    sc = tiny("decoupled", learners=2, chips=1, steps=STEPS)
    live = run_under_attack(sc, runs_dir, FRAMES, seed=1)
    assert live.error == "", live.error
    t = live.tally

    # every hostile frame was sent, from both families, while the learners trained
    assert t.frames >= FRAMES, t
    assert 0 < t.authenticated < t.frames, t
    assert live.started > 0 and live.ended >= live.started
    # the run completed: every learner did all its steps, and the syncer merged after the attack began
    assert live.steps == {0: STEPS, 1: STEPS}
    assert live.merges(live.started) > 0, "no merge after the attack started"
    assert live.report["global_model_finite"] is True
    # the syncer never failed, and closed every hostile connection itself, each with a logged reason
    assert live.syncer_up
    assert t.unlogged == [], t.unlogged
    assert t.closed_logged == t.closed_seen == t.attempts, [a for a in live.attempts if not a.closed_by_syncer]
    assert not [e for e in live.events if e["ev"] == "reader_error"]  # no unforeseen error on a connection's path
    accepted = t.refused_by[ACCEPTED]
    assert t.attempts - accepted >= t.attempts * 2 // 3, t.refused_by  # most refused by a frame check
    # nothing a hostile peer sent was merged: its pushes were all refused, the merges only the learners'
    pushes = [e for e in live.events if e["ev"] == "push" and e["c_tokens"] == PUSH_TOKENS]
    assert pushes and not [e for e in pushes if e["outcome"] in ("accepted", "carried")], pushes
    # no socket of a hostile peer left open in the syncer, only (at most) the learners' own connections
    assert live.leaked == set(), live.leaked
    assert 0 <= live.peers_after <= sc.topology.learners, live.peers_after
    # no process outlives the run
    assert_no_survivors(live.pids)
