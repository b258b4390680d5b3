"""What signing every frame costs: encode + send + receive + decode of one frame, with and without its tag.

Not a test: it prints a table. Frames of the sizes the links carry (a PING, a small fragment, a fragment of
the default model, a whole model of it) go through a real socket pair, signed
(`diloco_chaos/harness/wire/frame_auth.py`) and unsigned, in alternation so that a drift of the machine's speed hits
both alike; the table gives the median microseconds per frame, the extra cost of the tag and the throughput. Divide the
extra microseconds by the frames a learner's step sends and receives to get the cost per step.

    python bench/wire_auth.py [--repeats 400]
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

import torch
from table import Column, emit, parser  # bench/ is the script's directory: on sys.path when run

from diloco_chaos.harness.config.scenario import builtin
from diloco_chaos.harness.wire.frame_auth import FrameAuth
from diloco_chaos.harness.wire.framing import Message, MsgType, recv_message, send_message
from diloco_chaos.trainers.model import build_model

COLUMNS = (Column("frame", "frame", 26, left=True), Column("kib", "KiB", 9, ".1f"),
           Column("plain_us", "plain us", 10, ".1f"), Column("signed_us", "signed us", 10, ".1f"),
           Column("extra_us", "extra us", 9, "+.1f"), Column("extra_pct", "extra %", 8, "+.1f"),
           Column("signed_mb_s", "signed MB/s", 12, ".0f"))


def frames() -> dict[str, Message]:
    model = build_model(builtin("fault-free").model, 0)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    biggest = max(params.items(), key=lambda kv: kv[1].numel())
    meta = {"learner": 0, "fragment": 0, "base_version": 0, "c_steps": 4, "c_tokens": 64, "first_step": 0,
            "last_step": 3, "step_time_s": 0.1}
    return {"ping": Message(MsgType.PING, {"learner": 0, "seq": 1, "t": 1.5}),
            "push, one small tensor": Message(MsgType.PUSH, meta, {"w": torch.zeros(256)}),
            "push, largest tensor": Message(MsgType.PUSH, meta, {biggest[0]: biggest[1]}),
            "push, whole default model": Message(MsgType.PUSH, meta, params)}


def round_trip_us(msg: Message, a: socket.socket, b: socket.socket, sender: FrameAuth | None,
                  receiver: FrameAuth | None) -> float:
    got: list[Message] = []
    t0 = time.perf_counter()
    reader = threading.Thread(target=lambda: got.append(recv_message(b, 1 << 30, 10.0, auth=receiver)))
    reader.start()
    send_message(a, msg, 10.0, sender)
    reader.join(10.0)
    assert got and got[0].type is msg.type
    return (time.perf_counter() - t0) * 1e6


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=400, help="frames of each size and kind")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, msg in frames().items():
        a, b = socket.socketpair()
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        up, down = FrameAuth.for_learner(b"k" * 32, b"n" * 16, 0), FrameAuth.for_syncer(b"k" * 32, b"n" * 16, 0)
        plain, signed = [], []
        for _ in range(args.repeats):
            plain.append(round_trip_us(msg, a, b, None, None))
            signed.append(round_trip_us(msg, a, b, up, down))
        a.close()
        b.close()
        kib = sum(t.numel() * t.element_size() for t in msg.tensors.values()) / 1024
        p_us, s_us = statistics.median(plain), statistics.median(signed)
        rows.append({"frame": name, "kib": kib, "plain_us": p_us, "signed_us": s_us, "extra_us": s_us - p_us,
                     "extra_pct": 100 * (s_us - p_us) / p_us, "signed_mb_s": kib * 1024 / s_us})
    print(f"median over {args.repeats} frames of each kind, alternating plain and signed, one socket pair")
    emit(COLUMNS, rows, args.json)


if __name__ == "__main__":
    main()
