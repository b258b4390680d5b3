"""Fuzzing the two inputs from outside: scenario documents, and frames on the wire.

Scenario documents (tests/scenario_strategies.py: real section and key names with values of every type and
extreme, unknown keys, random tables, random fault lists and [random_faults]) go through
`harness.scenario.from_dict`; each must end as a Scenario or a ScenarioError, never anything else, and the
whole batch must stay within a memory bound (a document must not make the harness allocate by its numbers).

Not a test: it prints a table (the test command runs a small, fixed number of such cases as Hypothesis
properties in tests/test_frame_auth.py). Valid frames of every message kind the project sends, plain
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

    python bench/fuzz.py [--documents 10000] [--frames 10000] [--seed 0]
"""

from __future__ import annotations

import random
import resource
import socket
import struct
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import torch
from table import Column, emit, parser  # bench/ is the script's directory: on sys.path when run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ holds the project's message corpus
from harness.frame_auth import FrameAuth  # noqa: E402
from harness.wire import HEADER, ConnectionClosed, FrameError, Message, decode_frame, encode, recv_message  # noqa: E402
from tests.test_wire_messages import _sent_by_the_project  # noqa: E402

MAX = 1 << 20
SECRET, NONCE = b"k" * 32, b"n" * 16
COLUMNS = (Column("case", "case", 18, left=True), Column("frames", "frames", 8),
           Column("rejected", "rejected", 9), Column("unchanged", "accepted same", 14),
           Column("changed", "accepted CHANGED", 17), Column("unexpected", "unexpected exc", 15),
           Column("kinds", "rejections by kind", 60, left=True))


def same(a: Message, b: Message) -> bool:
    return (a.type is b.type and a.meta == b.meta and list(a.tensors) == list(b.tensors)
            and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors))


def mutate(frame: bytes, rng: random.Random, forge: bool) -> bytes:
    out = bytearray(frame)
    how = rng.randrange(4)
    if how == 0:
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif how == 1:
        at = rng.randrange(len(out))
        out[at:at + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(16))[: len(out[at:at + 16])]
    elif how == 2:
        del out[rng.randrange(len(out)):]
    else:
        out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    if forge and len(out) >= HEADER.size:
        body_end = HEADER.size + struct.unpack_from(">I", out, 8)[0]
        crc = zlib.crc32(out[HEADER.size:body_end], zlib.crc32(out[:HEADER.size - 4]))
        struct.pack_into(">I", out, HEADER.size - 4, crc)
    return bytes(out)


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

    from harness.scenario import ScenarioError, from_dict
    from tests.scenario_strategies import documents

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


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--documents", type=int, default=10_000, help="scenario documents (0: skip)")
    ap.add_argument("--frames", type=int, default=10_000, help="mutated frames per case (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.documents:
        doc_row = fuzz_documents(args.documents, args.seed)
        print("scenario documents through harness.scenario.from_dict")
        emit(DOC_COLUMNS, [doc_row], None)
    if args.frames:
        rng = random.Random(args.seed)
        rows = [run(case, args.frames, rng) for case in ("plain damage", "plain forgery", "signed damage",
                                                          "signed forgery")]
        print("mutated frames")
        emit(COLUMNS, rows, args.json)


if __name__ == "__main__":
    main()
