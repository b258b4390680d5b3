"""Live progress writes a line for each fault as it fires and ends, at once, beside the status lines."""

from __future__ import annotations

import io

from harness.progress import Progress, fault_line


def test_a_fault_is_on_screen_when_it_fires_and_when_it_ends() -> None:
    out = io.StringIO()
    p = Progress(2, stream=out, every_s=3600.0)
    p([{"ev": "step", "learner": 0, "step": 5}])  # the first status line
    p([{"ev": "fault_start", "index": 1, "action": "kill_chip", "describe": "kill_chip learner 1 chip 0",
        "reason": "learner 1 reached step 40"}])
    p([{"ev": "fault_end", "index": 1, "action": "kill_chip", "describe": "kill_chip learner 1 chip 0",
        "reason": "run end"}])
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # the status line is rate-limited, fault lines are not
    assert "fault F1 fired: kill_chip learner 1 chip 0; trigger: learner 1 reached step 40" in lines[1]
    assert "fault F1 ended: kill_chip learner 1 chip 0; run end" in lines[2]


def test_a_fault_that_hit_nothing_says_so() -> None:
    line = fault_line({"ev": "fault_start", "index": 0, "action": "freeze", "reason": "t >= 2 s",
                       "missed": "learner 0 is down"})
    assert line == "fault F0 fired: freeze; trigger: t >= 2 s (hit nothing: learner 0 is down)"
