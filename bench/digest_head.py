"""CPU of a request's digest when its head changes in one line (the cross-pod record of the tracker).

    .venv/bin/python bench/digest_head.py [--lines 200] [--n 200]

Every request of one tenant sends a system prompt of `--lines` rules whose first line is a
timestamp that moves on per request (the traffic diagnosis exists for: every head is new), once
with a date in each rule and once without. It measures process CPU per `RequestDigest.of` (the
head's unit keys, the dates without a cue, the digits-masked keys, the JSON schemas) after the
sketches are built, and prints a table. The head memo (`HEAD_MEMO_ENTRIES`) never hits here: each
head differs; what the unit memo (`UNIT_MEMO_ENTRIES`) saves is the point.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.prefix import digest  # noqa: E402
from app.prefix.fingerprint import Fingerprinter, prompt_input  # noqa: E402
from app.prefix.sketch import RequestSketch, build_sketch  # noqa: E402
from app.prefix.tokens import SegmentTokenizer  # noqa: E402


def sketches(fpr: Fingerprinter, lines: int, n: int, dated: bool) -> list[RequestSketch]:
    """`n` requests whose system prompt is a moving timestamp over `lines` fixed rules."""
    date = "as of 07/16/2026 " if dated else ""
    rules = "".join(f"- Rule {k}: {date}answer topic {k} in two sentences, cite the handbook.\n" for k in range(lines))
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": f"Now: 2026-07-16T09:{i // 60 % 60:02d}:{i % 60:02d}Z\n{rules}"},
                    {"role": "user", "content": "and now?"}]
        inp = prompt_input("chat", {"messages": messages})
        out.append(build_sketch(inp, fpr.complete_sync(fpr.prepare(inp, 16)).text or ""))
    return out


def cpu_per_digest(sks: list[RequestSketch]) -> float:
    """Process CPU per `RequestDigest.of`, in ms, with every memo empty at the start."""
    digest._head_memo.clear()
    digest._unit_memo.clear()
    start = time.process_time()
    for sk in sks:
        digest.RequestDigest.of(sk)
    return (time.process_time() - start) / len(sks) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    fpr = Fingerprinter(SegmentTokenizer.load())
    print(f"    .venv/bin/python bench/digest_head.py --lines {args.lines} --n {args.n}\n")
    print("| head | CPU per digest |")
    print("|---|---:|")
    for dated in (False, True):
        ms = cpu_per_digest(sketches(fpr, args.lines, args.n, dated))
        what = "a date in each rule" if dated else "no dates"
        print(f"| {args.lines} rules, {what}, a timestamp on top | {ms:.2f} ms |")


if __name__ == "__main__":
    main()
