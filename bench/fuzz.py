"""Fuzzing the two inputs from outside: scenario documents, and frames on the wire.

Scenario documents (tests/config/scenario_strategies.py: real section and key names with values of every type and
extreme, unknown keys, random tables, random fault lists and [random_faults]) go through
`diloco_chaos.harness.config.scenario.from_dict`; each must end as a Scenario or a ScenarioError, never anything else,
and the whole batch must stay within a memory bound (a document must not make the harness allocate by its numbers).

Not a test: it prints a table (the test command runs a small, fixed number of such cases as Hypothesis
properties in tests/wire/test_frame_auth.py). Valid frames of every message kind the project sends, plain
(as before the handshake and in checkpoint slots) and signed (every frame after it), are mutated and
decoded, the signed ones through a real socket with the receiving end's keys. Mutations:

* damage: 1-8 random bit flips, a byte run overwritten, the frame cut short or extended (what a bad link
  does; the CRC is left as it was);
* forgery: the same, then the CRC made right again (what a peer or a box in the middle does on purpose).

Each case ends as: rejected (by error kind), accepted unchanged (flips that cancelled out, bytes past
the frame's announced end), accepted CHANGED (the receiver took a message that differs from the one
sent), or an unexpected exception (anything but the wire's documented errors). The last two must be 0,
except "accepted changed" for forged plain frames: a CRC is not a signature, which is why frames after
the handshake are signed.

Live (`--live N`): a real tiny decoupled run (2 learners x 1 chip) whose syncer is sent N hostile frames
from authenticated and unauthenticated peers while the learners train (`diloco_chaos/harness/testing/hostile_run.py`,
the attacks of `diloco_chaos/harness/testing/hostile_peer.py`, one connection each, the authenticated ones as learner
1). One row: frames sent (authenticated among them), connections the syncer closed with a logged reason, whether it
stayed up, merges during the attack, hostile sockets the syncer still held afterwards, learner steps completed, how
often the attacked learner's link reconnected (each authenticated attack replaces its connection); then
the frames by attack with the check that refused them.

    python bench/fuzz.py [--documents 10000] [--frames 10000] [--live 1000] [--live-steps 600] [--seed 0]
"""

from __future__ import annotations

import random
import resource
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from table import Column, emit, parser  # bench/ is the script's directory: on sys.path when run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ holds the project's message corpus
from diloco_chaos.harness.testing.hostile_peer import mutate  # noqa: E402
from diloco_chaos.harness.wire.frame_auth import FrameAuth  # noqa: E402
from diloco_chaos.harness.wire.framing import ConnectionClosed, FrameError, Message, decode_frame, encode, recv_message  # noqa: E402
from tests.wire.test_wire_messages import _sent_by_the_project  # noqa: E402

MAX = 1 << 20
SECRET, NONCE = b"k" * 32, b"n" * 16
COLUMNS = (Column("case", "case", 18, left=True), Column("frames", "frames", 8),
           Column("rejected", "rejected", 9), Column("unchanged", "accepted same", 14),
           Column("changed", "accepted CHANGED", 17), Column("unexpected", "unexpected exc", 15),
           Column("kinds", "rejections by kind", 60, left=True))


def same(a: Message, b: Message) -> bool:
    return (a.type is b.type and a.meta == b.meta and list(a.tensors) == list(b.tensors)
            and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors))


def receive_signed(frame: bytes, learner: int) -> Message:
    a, b = socket.socketpair()
    try:
        a.sendall(frame)
        a.shutdown(socket.SHUT_WR)
        return recv_message(b, MAX, 5.0, auth=FrameAuth.for_syncer(SECRET, NONCE, learner))
    finally:
        a.close()
        b.close()


def run(case: str, n: int, rng: random.Random) -> dict[str, object]:
    signed, forge = case.startswith("signed"), case.endswith("forgery")
    messages = _sent_by_the_project()
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for _ in range(n):
        msg = rng.choice(messages)
        frame = encode(msg, FrameAuth.for_learner(SECRET, NONCE, 1) if signed else None)
        bad = mutate(frame, rng, forge)
        try:
            got = receive_signed(bad, 1) if signed else decode_frame(bad, MAX)
        except FrameError as e:
            counts["rejected"] += 1
            kinds[e.kind] += 1
            continue
        except ConnectionClosed:
            counts["rejected"] += 1
            kinds["closed"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - what this bench counts: anything the wire does not document
            counts["unexpected"] += 1
            kinds[f"UNEXPECTED {type(e).__name__}"] += 1
            continue
        counts["unchanged" if same(got, msg) else "changed"] += 1
    return {"case": case, "frames": n, **{k: counts[k] for k in ("rejected", "unchanged", "changed", "unexpected")},
            "kinds": ", ".join(f"{k} {v}" for k, v in kinds.most_common())}


def fuzz_documents(n: int, seed: int) -> dict[str, object]:
    """`n` generated documents through from_dict: accepted, rejected (by the first words of the error, i.e.
    which rule), unexpected exceptions; and the process's peak memory afterwards."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hyp_seed

    from diloco_chaos.harness.config.scenario import from_dict
    from diloco_chaos.harness.config.sections import ScenarioError
    from tests.config.scenario_strategies import documents

    counts: Counter[str] = Counter()
    rules: Counter[str] = Counter()

    @hyp_seed(seed)
    @settings(max_examples=n, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(doc=documents())
    def one(doc: dict[str, object]) -> None:
        try:
            from_dict(doc)
        except ScenarioError as e:
            counts["rejected"] += 1
            rules[str(e).split(" ", 1)[0].split("=")[0].split(".")[0].split("[")[0]] += 1
            return
        except Exception as e:  # noqa: BLE001 - what this bench counts: anything but the documented error
            counts["unexpected"] += 1
            rules[f"UNEXPECTED {type(e).__name__}: {e}"[:60]] += 1
            return
        counts["accepted"] += 1

    t0 = time.perf_counter()
    one()
    return {"documents": sum(counts.values()), "accepted": counts["accepted"], "rejected": counts["rejected"],
            "unexpected": counts["unexpected"], "wall_s": time.perf_counter() - t0,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rules": ", ".join(f"{k} {v}" for k, v in rules.most_common(8))}


DOC_COLUMNS = (Column("documents", "documents", 10), Column("accepted", "accepted", 9),
               Column("rejected", "rejected", 9), Column("unexpected", "unexpected exc", 15),
               Column("wall_s", "wall s", 8, ".1f"), Column("peak_mb", "peak MB", 8, ".0f"),
               Column("rules", "rejected by (first key of the message)", 70, left=True))


LIVE_COLUMNS = (Column("frames", "frames sent", 12), Column("authenticated", "authenticated", 14),
                Column("attempts", "connections", 12), Column("closed", "closed+logged", 14),
                Column("up", "syncer up", 10), Column("merges", "merges during", 14),
                Column("merges_after", "merges after", 13), Column("leaked", "leaked conns", 13),
                Column("steps", "learner steps", 14), Column("reconnects", "l1 reconnects", 14),
                Column("attack_s", "attack s", 9, ".1f"),
                Column("reasons", "syncer's close reasons", 60, left=True))
KIND_COLUMNS = (Column("kind", "attack", 24, left=True), Column("auth", "auth", 5), Column("frames", "frames", 7),
                Column("closed", "closed", 7), Column("refused", "refused by (syncer's event kind)", 60, left=True))


def fuzz_live(frames: int, steps: int, seed: int) -> tuple[dict[str, object], list[dict[str, object]]]:
    """A real run attacked with `frames` hostile frames: its row, and one row per attack kind."""
    import tempfile

    from diloco_chaos.harness.config import scenario
    from diloco_chaos.harness.testing.hostile_peer import KINDS, PUSH_TOKENS
    from diloco_chaos.harness.testing.hostile_run import outcomes, run_under_attack
    from tests.conftest import tiny_table

    sc = scenario.from_dict(tiny_table("decoupled", learners=2, chips=1, steps=steps))
    with tempfile.TemporaryDirectory() as root:
        live = run_under_attack(sc, root, frames, seed=seed)
    if live.error:
        print(f"attack stopped early: {live.error}")
    t = live.tally
    steps_done = live.steps
    row = {"frames": t.frames, "authenticated": t.authenticated, "attempts": t.attempts,
           "closed": t.closed_logged, "up": "yes" if live.syncer_up else "NO",
           "merges": live.merges(live.started, live.ended), "merges_after": live.merges(live.ended),
           "leaked": len(live.leaked), "steps": f"{sum(steps_done.values())}/{steps * len(steps_done)}",
           "reconnects": live.reconnects(),
           "attack_s": live.ended - live.started,
           "reasons": ", ".join(f"{k} {v}" for k, v in t.reasons.most_common())}
    refused: dict[str, Counter[str]] = {}
    closed: Counter[str] = Counter()
    for o in outcomes(live.attempts, live.events):
        cut = o.closed is not None and o.closed.startswith("replaced")  # the real learner's reconnect came first
        refused.setdefault(o.attempt.kind, Counter())[o.refused or ("replaced" if cut else "-")] += 1
        closed[o.attempt.kind] += o.closed is not None
    pushes = Counter(str(e["outcome"]) for e in live.events if e["ev"] == "push" and e["c_tokens"] == PUSH_TOKENS)
    pushes["other learner's id"] = sum(1 for e in live.events if e["ev"] == "push_rejected"
                                       and e.get("reason") == "learner id does not match the connection")
    row["pushes"] = ", ".join(f"{k} {v}" for k, v in pushes.most_common())
    kinds = [{"kind": k, "auth": "yes" if KINDS[k][0] else "no", "frames": t.by_kind[k], "closed": closed[k],
              "refused": ", ".join(f"{r} {n}" for r, n in refused[k].most_common())} for k in refused]
    return row, kinds


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--documents", type=int, default=10_000, help="scenario documents (0: skip)")
    ap.add_argument("--frames", type=int, default=10_000, help="mutated frames per case (0: skip)")
    ap.add_argument("--live", type=int, default=1000, help="hostile frames sent to a live run's syncer (0: skip)")
    ap.add_argument("--live-steps", type=int, default=600, help="steps of each learner of that run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.documents:
        doc_row = fuzz_documents(args.documents, args.seed)
        print("scenario documents through diloco_chaos.harness.config.scenario.from_dict")
        emit(DOC_COLUMNS, [doc_row], None)
    if args.frames:
        rng = random.Random(args.seed)
        rows = [run(case, args.frames, rng) for case in ("plain damage", "plain forgery", "signed damage",
                                                          "signed forgery")]
        print("mutated frames")
        emit(COLUMNS, rows, args.json)
    if args.live:
        live_row, kind_rows = fuzz_live(args.live, args.live_steps, args.seed)
        print(f"a live run's syncer sent {args.live} hostile frames (2 learners x 1 chip, {args.live_steps} steps)")
        emit(LIVE_COLUMNS, [live_row], None)
        print(f"hostile PUSHes read by the syncer, by the algorithm's outcome: {live_row['pushes']}")
        print("by attack (one connection each; '-': accepted by the wire, refused by the algorithm; "
              "'replaced': closed when the real learner reconnected, before its frame was read)")
        emit(KIND_COLUMNS, kind_rows, None)


if __name__ == "__main__":
    main()
