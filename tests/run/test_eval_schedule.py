"""The eval schedule: token milestones spread over the planned run, a wall-clock ceiling, restored syncers."""

from __future__ import annotations

from diloco_chaos.harness.syncer.eval_schedule import EvalSchedule, planned_tokens


def test_planned_tokens_counts_every_chips_every_step() -> None:
    assert planned_tokens(learners=4, chips_per_learner=2, steps=300, batch_size=8, seq_len=64) == 4 * 2 * 300 * 8 * 64


def test_token_milestones_give_about_points_evals_whatever_the_wall_time() -> None:
    sched = EvalSchedule.start(planned=1000.0, points=20, every_s=1e9, now=0.0)
    taken = 0
    for i in range(1, 1001):  # one token merged per call; the clock never reaches every_s
        if sched.due(float(i), float(i)) is not None:
            assert sched.due(float(i), float(i)) == "progress"
            sched.taken(float(i), float(i))
            taken += 1
    assert taken == 20


def test_a_merge_passing_several_milestones_gives_one_eval_and_skips_past_them() -> None:
    sched = EvalSchedule.start(planned=100.0, points=10, every_s=1e9, now=0.0)
    assert sched.due(0.0, 35.0) == "progress"
    sched.taken(0.0, 35.0)
    assert sched.next_progress == 40.0
    assert sched.due(0.0, 39.9) is None


def test_the_wall_clock_triggers_while_nothing_is_merged() -> None:
    sched = EvalSchedule.start(planned=100.0, points=10, every_s=3.0, now=10.0)
    assert sched.due(12.9, 0.0) is None
    assert sched.due(13.0, 0.0) == "time"
    sched.taken(13.0, 0.0)
    assert sched.due(15.9, 0.0) is None and sched.due(16.0, 0.0) == "time"


def test_points_zero_leaves_only_the_wall_clock() -> None:
    sched = EvalSchedule.start(planned=100.0, points=0, every_s=3.0, now=0.0)
    assert sched.due(1.0, 1e9) is None
    assert sched.due(3.0, 1e9) == "time"


def test_a_restored_syncer_starts_past_the_milestones_it_already_took() -> None:
    sched = EvalSchedule.start(planned=100.0, points=10, every_s=1e9, now=0.0)
    sched.taken(0.0, 57.0)
    assert sched.next_progress == 60.0
    assert sched.due(0.0, 58.0) is None


def test_a_milestone_waits_while_evals_would_take_more_than_their_share_of_a_core() -> None:
    sched = EvalSchedule.start(planned=1.0, points=10, every_s=1e9, now=0.0, max_share=0.05)
    sched.cost(0.02)  # the initial eval took 20 ms of CPU: the next may start 0.4 s after it
    assert sched.due(0.39, 0.15) is None
    assert sched.due(0.40, 0.15) == "progress"
    sched.taken(0.40, 0.15)
    assert sched.due(0.79, 0.35) is None and sched.due(0.80, 0.35) == "progress"
    sched.cost(0.0)
    assert sched.due(0.41, 0.35) == "progress"  # free evals: only progress decides
