"""Fingerprint cost on the hot path and off it, and break-diagnosis accuracy (issue 4).

    .venv/bin/python bench/fingerprint.py [--rounds 20] [--mb 1.0]
    (or: prefixgate bench fingerprint [...])

A ~1 MB chat prompt (a system message of Python standard-library source, which the built-in
tokenizer encodes at ~0.27 tokens/char) through `Fingerprinter`, as the prefix hook runs it:
- added time before the first upstream byte = `prompt_input` + `prepare` (render, split, memo
  walk, inline encode of small misses), cold (a system prompt never seen) and warm (seen);
- exact chain ready, cold = `prepare` + `complete` (tokenise the misses, hash every block),
  against the tokenizer's own single `encode` of the same text (baseline measured in the same run,
  on a separate tokenizer instance);
- exact chain ready when only a new turn was appended to a known conversation.
Targets: added time p50 <= 2 ms cold and warm; cold ready <= 1.5x encode; new turn <= 5 ms.

Incremental (issue 16): a 100 KB and a 1 MB user message whose head was seen before (the same
document, a new last line each request): gateway CPU (process time, every thread) until the exact
chain exists, with incremental tokenisation (this code) and without it (`incremental` off on a
second tokenizer: the tail-less segment memo of before, so the whole message is re-encoded), in
the same run, plus how the request was routed (exact on the hot path, or pending). Target: 100 KB
<= 0.5 ms, 1 MB small.

Diagnosis: precision/recall per cause on tests/fixtures/diagnosis/corpus.jsonl (target >= 0.95).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tokenizers import Tokenizer  # noqa: E402

from app.prefix.default_tokenizer import DEFAULT_TOKENIZER_DIR  # noqa: E402
from app.prefix.diagnose import CAUSES  # noqa: E402
from app.prefix.fingerprint import Fingerprinter, prompt_input  # noqa: E402
from app.prefix.lint import analyse  # noqa: E402
from app.prefix.tokens import SegmentTokenizer  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "diagnosis" / "corpus.jsonl"


def corpus_text(chars: int) -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    size = 0
    for path in sorted(stdlib.glob("**/*.py")):
        text = path.read_text(errors="ignore")
        out.append(text)
        size += len(text)
        if size >= chars:
            break
    return "".join(out)[:chars]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def ms(x: float) -> str:
    return f"{1000 * x:.2f} ms"


def hot_path(fpr: Fingerprinter, body: dict) -> tuple[float, object]:
    t0 = time.perf_counter()
    fp = fpr.prepare(prompt_input("chat", body), 16)
    return time.perf_counter() - t0, fp


def bench_hot(fpr: Fingerprinter, big: str, rounds: int) -> dict[str, object]:
    cold, warm, ready, newturn = [], [], [], []
    baseline = Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))
    baseline.encode(big, add_special_tokens=False)  # same BPE word-cache state as the fingerprinter's
    encode_t = []
    for i in range(rounds):
        system = f"Document set {i} of the benchmark.\n{big}"
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Summarise."}]}
        dt, fp = hot_path(fpr, body)
        cold.append(dt)
        if i < 3:  # the slow part: a whole cold chain vs one plain encode, alternating
            text = fp.text or ""
            t0 = time.perf_counter()
            baseline.encode(text.replace("Document set", "Document sat", 1), add_special_tokens=False)
            encode_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fpr.complete_sync(fp)
            ready.append(dt + time.perf_counter() - t0)
        else:
            fpr.complete_sync(fp)
        dt, fp2 = hot_path(fpr, body)
        assert fp2.complete, "warm prompt must be complete on the hot path"
        warm.append(dt)
        follow = {"messages": body["messages"] + [
            {"role": "assistant", "content": "It is a collection of Python modules. " * 8},
            {"role": "user", "content": f"Which module handles paths? ({i})"}]}
        dt, fp3 = hot_path(fpr, follow)
        assert fp3.complete, "a new turn must be encoded inline"
        newturn.append(dt)
        tokens = fp.num_tokens
    return {"cold": cold, "warm": warm, "ready": ready, "encode": encode_t, "newturn": newturn,
            "tokens": tokens}


def bench_incremental(big: str, chars: int, rounds: int, incremental: bool) -> dict[str, object]:
    """CPU and wall time to an exact chain for `rounds` requests whose message is the first
    `chars` of `big` plus a new last line (the first request, cold, is not counted)."""
    tok = SegmentTokenizer.load()
    tok.incremental = tok.incremental and incremental
    fpr = Fingerprinter(tok)
    doc = big[:chars]

    def body(i: int) -> dict:
        return {"messages": [{"role": "system", "content": "You answer questions about code."},
                             {"role": "user", "content": f"{doc}\nQuestion {i}: which module handles paths?"}]}

    fpr.complete_sync(fpr.prepare(prompt_input("chat", body(-1)), 16))
    bodies = [body(i) for i in range(rounds)]
    cpu, hot, exact = [], [], 0
    for b in bodies:
        c0, t0 = time.process_time(), time.perf_counter()
        fp = fpr.prepare(prompt_input("chat", b), 16)
        hot.append(time.perf_counter() - t0)
        exact += fp.complete
        fpr.complete_sync(fp)
        cpu.append(time.process_time() - c0)
    fpr.close()
    return {"cpu": cpu, "hot": hot, "exact": exact / rounds}


def bench_diagnosis(fpr: Fingerprinter) -> dict[str, tuple[float, float, int]]:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    for row in rows:
        got = asyncio.run(analyse([row["prev"], row["cur"]], fpr, 16))[1]["cause"] or "none"
        label = row["label"] or "none"
        if got == label:
            tp[label] += 1
        else:
            fp[got] += 1
            fn[label] += 1
    out = {}
    for cause in (*CAUSES, "none"):
        support = tp[cause] + fn[cause]
        if support:
            out[cause] = (tp[cause] / max(1, tp[cause] + fp[cause]), tp[cause] / support, support)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--mb", type=float, default=1.0)
    args = parser.parse_args(argv)
    big = corpus_text(int(args.mb * 1_000_000))
    fpr = Fingerprinter(SegmentTokenizer.load())
    r = bench_hot(fpr, big, args.rounds)
    enc = statistics.median(r["encode"])  # type: ignore[arg-type]
    ready = statistics.median(r["ready"])  # type: ignore[arg-type]
    cmd = "  ".join(["$", ".venv/bin/python bench/fingerprint.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"\nFingerprint, {len(big) / 1e6:.2f} MB chat prompt = {r['tokens']} tokens, block 16, "
          f"{args.rounds} rounds\n{cmd}\n")
    print(f"| {'measure':<48} | {'p50':>10} | {'p99/max':>10} | target |")
    print(f"|{'-' * 50}|{'-' * 12}|{'-' * 12}|--------|")
    rows = [
        ("added before first upstream byte, cold", r["cold"], "<= 2 ms"),
        ("added before first upstream byte, warm", r["warm"], "<= 2 ms"),
        ("exact chain ready, new turn appended", r["newturn"], "<= 5 ms"),
        ("exact chain ready, cold (prepare + complete)", r["ready"], ""),
        ("tokenizer's own single encode (baseline)", r["encode"], ""),
    ]
    for name, xs, target in rows:
        print(f"| {name:<48} | {ms(statistics.median(xs)):>10} | {ms(pct(xs, 0.99)):>10} | {target:<6} |")  # type: ignore[arg-type]
    print(f"| {'cold ready / encode':<48} | {ready / enc:>9.2f}x | {'':>10} | <= 1.5x |")
    print("\nIncremental: head seen before, a new last line each request "
          "(gateway CPU = process time until the exact chain exists)\n")
    print(f"| {'prompt':<7} | {'path':<18} | {'CPU p50':>9} | {'CPU p90':>9} | {'hot wall p50':>12} | "
          f"{'exact on hot path':>17} |")
    print(f"|{'-' * 9}|{'-' * 20}|{'-' * 11}|{'-' * 11}|{'-' * 14}|{'-' * 19}|")
    for label, chars in (("100 KB", 100_000), ("1 MB", len(big))):
        for path, on in (("incremental (new)", True), ("whole segment (old)", False)):
            n = args.rounds if on else max(3, args.rounds // 4)
            x = bench_incremental(big, chars, n, on)
            print(f"| {label:<7} | {path:<18} | {ms(statistics.median(x['cpu'])):>9} | "  # type: ignore[arg-type]
                  f"{ms(pct(x['cpu'], 0.9)):>9} | {ms(statistics.median(x['hot'])):>12} | "  # type: ignore[arg-type]
                  f"{100 * x['exact']:>16.0f}% |")  # type: ignore[operator]
    print("\nDiagnosis on tests/fixtures/diagnosis/corpus.jsonl\n")
    print(f"| {'cause':<16} | {'precision':>9} | {'recall':>6} | {'cases':>5} |")
    print(f"|{'-' * 18}|{'-' * 11}|{'-' * 8}|{'-' * 7}|")
    for cause, (p, rc, n) in bench_diagnosis(fpr).items():
        print(f"| {cause:<16} | {p:>9.3f} | {rc:>6.3f} | {n:>5} |")
    fpr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
