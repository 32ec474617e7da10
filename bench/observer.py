"""CPU cost of the stream observer on one vLLM-shaped chat stream (34 reads: role chunk, 30 tokens,
finish, usage, [DONE]; one event per read, as vLLM writes them), with and without dropping the
usage chunk. Thread CPU time, best of many rounds (robust on a busy machine).

    python bench/observer.py
"""

from __future__ import annotations

import time

import orjson

from app.proxy.clock import StreamClock
from app.proxy.context import Timings
from app.proxy.observer import StreamObserver
from app.proxy.openai_shape import shape_for

BASE = {"id": "chatcmpl-aeccebee04226811", "object": "chat.completion.chunk", "created": 1795996214,
        "model": "tiny"}


def event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def choice(delta: dict, finish: str | None = None) -> dict:
    return {**BASE, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


READS = ([event(choice({"role": "assistant", "content": ""}))]
         + [event(choice({"content": f" tok{i}"})) for i in range(30)]
         + [event(choice({"content": ""}, "length")),
            event({**BASE, "choices": [], "usage": {"prompt_tokens": 1814, "completion_tokens": 30}}),
            b"data: [DONE]\n\n"])


def one_stream(drop_usage: bool) -> None:
    observer = StreamObserver(shape_for("chat"), StreamClock(Timings(arrival=0.0)), drop_usage, True)
    for i, data in enumerate(READS):
        observer.feed(data, float(i))
    observer.finish()
    assert observer.done and observer.usage


def main() -> None:
    for drop_usage in (True, False):
        best = float("inf")
        for _ in range(100):
            t0 = time.thread_time()
            for _ in range(200):
                one_stream(drop_usage)
            best = min(best, (time.thread_time() - t0) / 200)
        print(f"drop_usage={drop_usage}: {best * 1e6:.1f} us per {len(READS)}-read stream "
              f"({best * 1e6 / len(READS):.2f} us per read)")


if __name__ == "__main__":
    main()
