"""CPU of diagnosing one break, and of reading a new head for the digest, on long prompts.

    .venv/bin/python bench/diagnosis_cost.py [--size 1000000] [--reps 5]

Diagnosis runs off the event loop, but every break of a tenant pays it, and a digest is read for
every new head: both must cost what their window costs, not what the prompt's length costs. Cases
(a system prompt and one user message, words from the peer harness's generator):
- another document on one line / on lines of 200 characters (the peer harness's pool: every
  request a break, nothing re-aligns) / on lines of ~80 characters with a question on its own
  line after it;
- another document in the system prompt's template (retrieval: the context between the same
  opening and closing lines, the same question), on ~80-character lines and on 200-character ones;
- a question put before the same document (`question_first`: it re-aligns);
- a per-request clock in the system prompt, which is one line holding the document after it (the
  value changed near the divergence);
- the digest of a new head that is one line with a year in it (`RequestDigest.of`, the date
  detector around each year).
Printed: the best of `--reps` wall times per case (one thread, so CPU), and the cause.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "peerbench"))

from load_client import make_prompt  # noqa: E402  (the peer harness's own prompt generator)

from app.prefix import digest  # noqa: E402
from app.prefix.diagnose import diagnose  # noqa: E402
from app.prefix.fingerprint import Fingerprinter, prompt_input  # noqa: E402
from app.prefix.sketch import RequestSketch, build_sketch  # noqa: E402
from app.prefix.tokens import SegmentTokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    fpr = Fingerprinter(SegmentTokenizer.load())
    rng = random.Random(7)

    def sketch(system: str, user: str) -> RequestSketch:
        inp = prompt_input("chat", {"messages": [{"role": "system", "content": system},
                                                 {"role": "user", "content": user}]})
        return build_sketch(inp, fpr.complete_sync(fpr.prepare(inp, 16)).text or "")

    doc_a, doc_b = make_prompt(rng, a.size), make_prompt(rng, a.size)

    def lines(s: str) -> str:
        return "\n".join(s[i:i + 200] for i in range(0, len(s), 200))

    sys_ = "You are a helpful assistant."
    question = "Which paragraph says the most about the world? Answer in one line. " * 4
    page_a, page_b = make_prompt(rng, a.size, 80), make_prompt(rng, a.size, 80)
    context = "You answer from the context below.\nContext:\n{}\n\nAnswer in one line.\nCite the paragraph."
    pairs = {
        "another document, one line": (sketch(sys_, doc_a + " [q1]"), sketch(sys_, doc_b + " [q2]")),
        "another document, 200-char lines": (sketch(sys_, lines(doc_a)), sketch(sys_, lines(doc_b))),
        "another document, 80-char lines, a question after it": (sketch(sys_, page_a + "\nWhat is it about?"),
                                                                 sketch(sys_, page_b + "\nWho wrote it?")),
        "another document in the system prompt's context, 80-char lines": (
            sketch(context.format(page_a), "What is it about?"), sketch(context.format(page_b), "What is it about?")),
        "another document in the system prompt's context, 200-char lines": (
            sketch(context.format(lines(doc_a)), "What is it about?"),
            sketch(context.format(lines(doc_b)), "What is it about?")),
        "a question before the same document": (sketch(sys_, doc_a), sketch(sys_, question + doc_a)),
        "a clock before a one-line document": (sketch(f"Time: 2026-04-14T09:31:07Z. {doc_a}", "Hi"),
                                               sketch(f"Time: 2026-04-14T09:32:55Z. {doc_a}", "Hi")),
    }
    print(f"| case ({a.size:,} chars) | ms | cause |\n|---|---:|---|")
    for name, (prev, cur) in pairs.items():
        best, cause = float("inf"), None
        for _ in range(a.reps):
            t = time.perf_counter()
            cause = diagnose(prev, cur).cause
            best = min(best, time.perf_counter() - t)
        print(f"| {name} | {best * 1e3:.2f} | {cause} |")
    head = sketch(doc_a[:a.size // 2] + " in 2024 " + doc_a[a.size // 2:], "Hi")
    best = float("inf")
    for _ in range(a.reps):
        digest._head_memo.clear()  # a new head each time
        t = time.perf_counter()
        digest.RequestDigest.of(head)
        best = min(best, time.perf_counter() - t)
    print(f"| the digest of a new one-line head with a year in it | {best * 1e3:.2f} | |")
    print(f"\ncommand: .venv/bin/python bench/diagnosis_cost.py --size {a.size} --reps {a.reps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
