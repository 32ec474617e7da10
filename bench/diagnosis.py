"""Diagnosis accuracy: cause and dynamic-span scores on the labelled corpora (issue 20).

    .venv/bin/python bench/diagnosis.py [--split old,tune,heldout,tune2,heldout2,heldout3,heldout4,heldout5,heldout6,heldout7,heldout8,heldout9,heldout10,heldout11,heldout12,heldout13,heldout14,heldout15,heldout16,heldout17,heldout18,heldout19,heldout20,heldout21,heldout22,heldout23,heldout24,heldout25,heldout26,heldout27,heldout28,heldout29,heldout30,heldout31,heldout32,heldout33,heldout34,heldout35,heldout36,heldout37,heldout38,heldout39,heldout40,heldout41,heldout42,heldout43,heldout44,heldout45,heldout46,heldout47,heldout48,heldout49,heldout50,heldout51,heldout52,heldout53,heldout54,heldout55,heldout56,heldout57,heldout58,heldout59,heldout60,heldout61,heldout62,heldout63,heldout64,heldout65,heldout66,heldout67,heldout68,heldout69,heldout70,heldout71,heldout72,heldout73,heldout74,heldout75,heldout76,heldout77,heldout78,heldout79,heldout80,heldout81,heldout82,heldout83,heldout84,heldout85,heldout86,heldout87,heldout88]
        [--errors] [--pods 2]
    .venv/bin/python bench/diagnosis.py --split heldout89   # the held-out split: for reporting only
    (corpora: tests/fixtures/diagnosis/corpus.jsonl, tests/fixtures/diagnosis_v2/<split>.jsonl)

The default is the tune side (the first corpus, `tune`, `tune2`, and the earlier held-out splits:
`heldout` joined the tune side when `heldout2` was written, `heldout2` when `heldout3` was,
`heldout3` when `heldout4` was, `heldout4` when `heldout5` was, `heldout5` when `heldout6` was, `heldout6` when `heldout7` was, `heldout7` when `heldout8` was, `heldout8` when `heldout9` was, `heldout9` when `heldout10` was, `heldout10` when `heldout11` was, `heldout11` when `heldout12` was, `heldout12` when `heldout13` was, `heldout13` when `heldout14` was, `heldout14` when `heldout15` was, `heldout15` when `heldout16` was, `heldout16` when `heldout17` was, `heldout17` when `heldout18` was, `heldout18` when `heldout19` was, `heldout19` when `heldout20` was, `heldout20` when `heldout21` was, `heldout21` when `heldout22` was, `heldout22` when `heldout23` was, `heldout23` when `heldout24` was, `heldout24` when `heldout25` was, `heldout25` when `heldout26` was, `heldout26` when `heldout27` was, `heldout27` when `heldout28` was, `heldout28` when `heldout29` was, `heldout29` when `heldout30` was, `heldout30` when `heldout31` was, `heldout31` when `heldout32` was, `heldout32` when `heldout33` was, `heldout33` when `heldout34` was, `heldout34` when `heldout35` was, `heldout35` when `heldout36` was, `heldout36` when `heldout37` was, `heldout37` when `heldout38` was, `heldout38` when `heldout39` was, `heldout39` when `heldout40` was, `heldout40` when `heldout41` was, `heldout41` when `heldout42` was, `heldout42` when `heldout43` was, `heldout43` when `heldout44` was, `heldout44` when `heldout45` was, `heldout45` when `heldout46` was, `heldout46` when `heldout47` was, `heldout47` when `heldout48` was, `heldout48` when `heldout49` was, `heldout49` when `heldout50` was, `heldout50` when `heldout51` was, `heldout51` when `heldout52` was, `heldout52` when `heldout53` was, `heldout53` when `heldout54` was, `heldout54` when `heldout55` was, `heldout55` when `heldout56` was, `heldout56` when `heldout57` was, `heldout57` when `heldout58` was, `heldout58` when `heldout59` was, `heldout59` when `heldout60` was, `heldout60` when `heldout61` was, `heldout61` when `heldout62` was, `heldout62` when `heldout63` was, `heldout63` when `heldout64` was, `heldout64` when `heldout65` was, `heldout65` when `heldout66` was, `heldout66` when `heldout67` was, `heldout67` when `heldout68` was, `heldout68` when `heldout69` was, `heldout69` when `heldout70` was, `heldout70` when `heldout71` was, `heldout71` when `heldout72` was, `heldout72` when `heldout73` was, `heldout73` when `heldout74` was, `heldout74` when `heldout75` was, `heldout75` when `heldout76` was, `heldout76` when `heldout77` was, `heldout77` when `heldout78` was, `heldout78` when `heldout79` was, `heldout79` when `heldout80` was, `heldout80` when `heldout81` was, `heldout81` when `heldout82` was, `heldout82` when `heldout83` was, `heldout83` when `heldout84` was, `heldout84` when `heldout85` was, `heldout85` when `heldout86` was, `heldout86` when `heldout87` was, `heldout87` when `heldout88` was, `heldout88` when `heldout89` was); `heldout89` is scored only when named (docs/diagnosis.md, *How the held-out split is kept apart*).

Every tenant's requests go through `prefixgate lint`'s analysis (the gateway's fingerprinting,
tracker and diagnosis, in-process). Each transition (request i against the tenant's earlier
requests) has one label: a cause, or none. Printed per corpus: accuracy, macro-F1 (over the causes
that occur in the labels or the answers), per-cause precision/recall/F1, dynamic-span exact-match
and overlap F1 (spans of every dynamic_head finding of a transition, primary or secondary, against
the changing values), secondary-cause recall, and false alarms on static look-alikes (a
dynamic_head answer where the value did not change). With `--pods N`, also how many answers
(cause, spans, secondary causes) change when N trackers sharing one Store take the tenant's
requests in turn (the in-process form of tests/test_diagnosis_pods.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.prefix.fingerprint import Fingerprinter, prompt_input  # noqa: E402
from app.prefix.lint import analyse  # noqa: E402
from app.prefix.sketch import build_sketch  # noqa: E402
from app.prefix.tokens import SegmentTokenizer  # noqa: E402
from app.prefix.tracker import TenantTracker  # noqa: E402
from app.state.memory import MemoryStore  # noqa: E402

CORPORA = {
    "old": ROOT / "tests/fixtures/diagnosis/corpus.jsonl",
    "tune": ROOT / "tests/fixtures/diagnosis_v2/tune.jsonl",
    "heldout": ROOT / "tests/fixtures/diagnosis_v2/heldout.jsonl",  # tune side since heldout2 exists
    "tune2": ROOT / "tests/fixtures/diagnosis_v2/tune2.jsonl",
    "heldout2": ROOT / "tests/fixtures/diagnosis_v2/heldout2.jsonl",  # tune side since heldout3 exists
    "heldout3": ROOT / "tests/fixtures/diagnosis_v2/heldout3.jsonl",  # tune side since heldout4 exists
    "heldout4": ROOT / "tests/fixtures/diagnosis_v2/heldout4.jsonl",  # tune side since heldout5 exists
    "heldout5": ROOT / "tests/fixtures/diagnosis_v2/heldout5.jsonl",  # tune side since heldout6 exists
    "heldout6": ROOT / "tests/fixtures/diagnosis_v2/heldout6.jsonl",  # tune side since heldout7 exists
    "heldout7": ROOT / "tests/fixtures/diagnosis_v2/heldout7.jsonl",  # tune side since heldout8 exists
    "heldout8": ROOT / "tests/fixtures/diagnosis_v2/heldout8.jsonl",  # tune side since heldout9 exists
    "heldout9": ROOT / "tests/fixtures/diagnosis_v2/heldout9.jsonl",  # tune side since heldout10 exists
    "heldout10": ROOT / "tests/fixtures/diagnosis_v2/heldout10.jsonl",  # tune side since heldout11 exists
    "heldout11": ROOT / "tests/fixtures/diagnosis_v2/heldout11.jsonl",  # tune side since heldout12 exists
    "heldout12": ROOT / "tests/fixtures/diagnosis_v2/heldout12.jsonl",  # tune side since heldout13 exists
    "heldout13": ROOT / "tests/fixtures/diagnosis_v2/heldout13.jsonl",  # tune side since heldout14 exists
    "heldout14": ROOT / "tests/fixtures/diagnosis_v2/heldout14.jsonl",  # tune side since heldout15 exists
    "heldout15": ROOT / "tests/fixtures/diagnosis_v2/heldout15.jsonl",  # tune side since heldout16 exists
    "heldout16": ROOT / "tests/fixtures/diagnosis_v2/heldout16.jsonl",  # tune side since heldout17 exists
    "heldout17": ROOT / "tests/fixtures/diagnosis_v2/heldout17.jsonl",  # tune side since heldout18 exists
    "heldout18": ROOT / "tests/fixtures/diagnosis_v2/heldout18.jsonl",  # tune side since heldout19 exists
    "heldout19": ROOT / "tests/fixtures/diagnosis_v2/heldout19.jsonl",  # tune side since heldout20 exists
    "heldout20": ROOT / "tests/fixtures/diagnosis_v2/heldout20.jsonl",  # tune side since heldout21 exists
    "heldout21": ROOT / "tests/fixtures/diagnosis_v2/heldout21.jsonl",  # tune side since heldout22 exists
    "heldout22": ROOT / "tests/fixtures/diagnosis_v2/heldout22.jsonl",  # tune side since heldout23 exists
    "heldout23": ROOT / "tests/fixtures/diagnosis_v2/heldout23.jsonl",  # tune side since heldout24 exists
    "heldout24": ROOT / "tests/fixtures/diagnosis_v2/heldout24.jsonl",  # tune side since heldout25 exists
    "heldout25": ROOT / "tests/fixtures/diagnosis_v2/heldout25.jsonl",  # tune side since heldout26 exists
    "heldout26": ROOT / "tests/fixtures/diagnosis_v2/heldout26.jsonl",  # tune side since heldout27 exists
    "heldout27": ROOT / "tests/fixtures/diagnosis_v2/heldout27.jsonl",  # tune side since heldout28 exists
    "heldout28": ROOT / "tests/fixtures/diagnosis_v2/heldout28.jsonl",  # tune side since heldout29 exists
    "heldout29": ROOT / "tests/fixtures/diagnosis_v2/heldout29.jsonl",  # tune side since heldout30 exists
    "heldout30": ROOT / "tests/fixtures/diagnosis_v2/heldout30.jsonl",  # tune side since heldout31 exists
    "heldout31": ROOT / "tests/fixtures/diagnosis_v2/heldout31.jsonl",  # tune side since heldout32 exists
    "heldout32": ROOT / "tests/fixtures/diagnosis_v2/heldout32.jsonl",  # tune side since heldout33 exists
    "heldout33": ROOT / "tests/fixtures/diagnosis_v2/heldout33.jsonl",  # tune side since heldout34 exists
    "heldout34": ROOT / "tests/fixtures/diagnosis_v2/heldout34.jsonl",  # tune side since heldout35 exists
    "heldout35": ROOT / "tests/fixtures/diagnosis_v2/heldout35.jsonl",  # tune side since heldout36 exists
    "heldout36": ROOT / "tests/fixtures/diagnosis_v2/heldout36.jsonl",  # tune side since heldout37 exists
    "heldout37": ROOT / "tests/fixtures/diagnosis_v2/heldout37.jsonl",  # tune side since heldout38 exists
    "heldout38": ROOT / "tests/fixtures/diagnosis_v2/heldout38.jsonl",  # tune side since heldout39 exists
    "heldout39": ROOT / "tests/fixtures/diagnosis_v2/heldout39.jsonl",  # tune side since heldout40 exists
    "heldout40": ROOT / "tests/fixtures/diagnosis_v2/heldout40.jsonl",  # tune side since heldout41 exists
    "heldout41": ROOT / "tests/fixtures/diagnosis_v2/heldout41.jsonl",  # tune side since heldout42 exists
    "heldout42": ROOT / "tests/fixtures/diagnosis_v2/heldout42.jsonl",  # tune side since heldout43 exists
    "heldout43": ROOT / "tests/fixtures/diagnosis_v2/heldout43.jsonl",  # tune side since heldout44 exists
    "heldout44": ROOT / "tests/fixtures/diagnosis_v2/heldout44.jsonl",  # tune side since heldout45 exists
    "heldout45": ROOT / "tests/fixtures/diagnosis_v2/heldout45.jsonl",  # tune side since heldout46 exists
    "heldout46": ROOT / "tests/fixtures/diagnosis_v2/heldout46.jsonl",  # tune side since heldout47 exists
    "heldout47": ROOT / "tests/fixtures/diagnosis_v2/heldout47.jsonl",  # tune side since heldout48 exists
    "heldout48": ROOT / "tests/fixtures/diagnosis_v2/heldout48.jsonl",  # tune side since heldout49 exists
    "heldout49": ROOT / "tests/fixtures/diagnosis_v2/heldout49.jsonl",  # tune side since heldout50 exists
    "heldout50": ROOT / "tests/fixtures/diagnosis_v2/heldout50.jsonl",  # tune side since heldout51 exists
    "heldout51": ROOT / "tests/fixtures/diagnosis_v2/heldout51.jsonl",  # tune side since heldout52 exists
    "heldout52": ROOT / "tests/fixtures/diagnosis_v2/heldout52.jsonl",  # tune side since heldout53 exists
    "heldout53": ROOT / "tests/fixtures/diagnosis_v2/heldout53.jsonl",  # tune side since heldout54 exists
    "heldout54": ROOT / "tests/fixtures/diagnosis_v2/heldout54.jsonl",  # tune side since heldout55 exists
    "heldout55": ROOT / "tests/fixtures/diagnosis_v2/heldout55.jsonl",  # tune side since heldout56 exists
    "heldout56": ROOT / "tests/fixtures/diagnosis_v2/heldout56.jsonl",  # tune side since heldout57 exists
    "heldout57": ROOT / "tests/fixtures/diagnosis_v2/heldout57.jsonl",  # tune side since heldout58 exists
    "heldout58": ROOT / "tests/fixtures/diagnosis_v2/heldout58.jsonl",  # tune side since heldout59 exists
    "heldout59": ROOT / "tests/fixtures/diagnosis_v2/heldout59.jsonl",  # tune side since heldout60 exists
    "heldout60": ROOT / "tests/fixtures/diagnosis_v2/heldout60.jsonl",  # tune side since heldout61 exists
    "heldout61": ROOT / "tests/fixtures/diagnosis_v2/heldout61.jsonl",  # tune side since heldout62 exists
    "heldout62": ROOT / "tests/fixtures/diagnosis_v2/heldout62.jsonl",  # tune side since heldout63 exists
    "heldout63": ROOT / "tests/fixtures/diagnosis_v2/heldout63.jsonl",  # tune side since heldout64 exists
    "heldout64": ROOT / "tests/fixtures/diagnosis_v2/heldout64.jsonl",  # tune side since heldout65 exists
    "heldout65": ROOT / "tests/fixtures/diagnosis_v2/heldout65.jsonl",  # tune side since heldout66 exists
    "heldout66": ROOT / "tests/fixtures/diagnosis_v2/heldout66.jsonl",  # tune side since heldout67 exists
    "heldout67": ROOT / "tests/fixtures/diagnosis_v2/heldout67.jsonl",  # tune side since heldout68 exists
    "heldout68": ROOT / "tests/fixtures/diagnosis_v2/heldout68.jsonl",  # tune side since heldout69 exists
    "heldout69": ROOT / "tests/fixtures/diagnosis_v2/heldout69.jsonl",  # tune side since heldout70 exists
    "heldout70": ROOT / "tests/fixtures/diagnosis_v2/heldout70.jsonl",  # tune side since heldout71 exists
    "heldout71": ROOT / "tests/fixtures/diagnosis_v2/heldout71.jsonl",  # tune side since heldout72 exists
    "heldout72": ROOT / "tests/fixtures/diagnosis_v2/heldout72.jsonl",  # tune side since heldout73 exists
    "heldout73": ROOT / "tests/fixtures/diagnosis_v2/heldout73.jsonl",  # tune side since heldout74 exists
    "heldout74": ROOT / "tests/fixtures/diagnosis_v2/heldout74.jsonl",  # tune side since heldout75 exists
    "heldout75": ROOT / "tests/fixtures/diagnosis_v2/heldout75.jsonl",  # tune side since heldout76 exists
    "heldout76": ROOT / "tests/fixtures/diagnosis_v2/heldout76.jsonl",  # tune side since heldout77 exists
    "heldout77": ROOT / "tests/fixtures/diagnosis_v2/heldout77.jsonl",  # tune side since heldout78 exists
    "heldout78": ROOT / "tests/fixtures/diagnosis_v2/heldout78.jsonl",  # tune side since heldout79 exists
    "heldout79": ROOT / "tests/fixtures/diagnosis_v2/heldout79.jsonl",  # tune side since heldout80 exists
    "heldout80": ROOT / "tests/fixtures/diagnosis_v2/heldout80.jsonl",  # tune side since heldout81 exists
    "heldout81": ROOT / "tests/fixtures/diagnosis_v2/heldout81.jsonl",  # tune side since heldout82 exists
    "heldout82": ROOT / "tests/fixtures/diagnosis_v2/heldout82.jsonl",  # tune side since heldout83 exists
    "heldout83": ROOT / "tests/fixtures/diagnosis_v2/heldout83.jsonl",  # tune side since heldout84 exists
    "heldout84": ROOT / "tests/fixtures/diagnosis_v2/heldout84.jsonl",  # tune side since heldout85 exists
    "heldout85": ROOT / "tests/fixtures/diagnosis_v2/heldout85.jsonl",  # tune side since heldout86 exists
    "heldout86": ROOT / "tests/fixtures/diagnosis_v2/heldout86.jsonl",  # tune side since heldout87 exists
    "heldout87": ROOT / "tests/fixtures/diagnosis_v2/heldout87.jsonl",  # tune side since heldout88 exists
    "heldout88": ROOT / "tests/fixtures/diagnosis_v2/heldout88.jsonl",  # tune side since heldout89 exists
    "heldout89": ROOT / "tests/fixtures/diagnosis_v2/heldout89.jsonl",
}
TUNE_SIDE = ("old", "tune", "heldout", "tune2", "heldout2", "heldout3", "heldout4", "heldout5", "heldout6", "heldout7",
             "heldout8", "heldout9", "heldout10", "heldout11", "heldout12", "heldout13", "heldout14",
             "heldout15", "heldout16", "heldout17", "heldout18", "heldout19", "heldout20", "heldout21", "heldout22",
             "heldout23", "heldout24", "heldout25", "heldout26", "heldout27", "heldout28", "heldout29", "heldout30", "heldout31", "heldout32", "heldout33", "heldout34", "heldout35", "heldout36", "heldout37", "heldout38", "heldout39", "heldout40", "heldout41", "heldout42", "heldout43", "heldout44", "heldout45", "heldout46", "heldout47", "heldout48", "heldout49", "heldout50", "heldout51", "heldout52", "heldout53", "heldout54", "heldout55", "heldout56", "heldout57", "heldout58", "heldout59", "heldout60", "heldout61", "heldout62", "heldout63", "heldout64", "heldout65", "heldout66", "heldout67", "heldout68", "heldout69", "heldout70", "heldout71", "heldout72", "heldout73", "heldout74", "heldout75", "heldout76", "heldout77", "heldout78", "heldout79", "heldout80", "heldout81", "heldout82", "heldout83", "heldout84", "heldout85", "heldout86", "heldout87", "heldout88")
HELDOUT = "heldout89"
NONE = "none"


@dataclass
class Transition:
    tenant: str
    index: int
    label: str
    spans: list[str]
    secondary: list[str]
    lookalike: bool


@dataclass
class Scores:
    transitions: int = 0
    accuracy: float = 0.0
    macro_f1: float = 0.0
    per_cause: dict[str, tuple[float, float, float, int]] = field(default_factory=dict)
    span_exact_f1: float = 0.0
    span_overlap_f1: float = 0.0
    secondary_recall: float | None = None
    lookalike_false_alarms: int = 0
    errors: list[str] = field(default_factory=list)


def load(path: Path) -> list[tuple[str, list[dict], list[Transition]]]:
    """(tenant name, request bodies, labelled transitions) for either corpus format."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "requests" in row:
            ts = [Transition(row["name"], i, row["labels"][i] or NONE, row["spans"][i], row["secondary"][i],
                             row["lookalike"]) for i in range(1, len(row["requests"]))]
            out.append((row["name"], row["requests"], ts))
        else:  # the first corpus: one pair per line
            spans = [row["span"]] if row.get("span") else []
            look = row["name"].startswith("decoy_static")
            out.append((row["name"], [row["prev"], row["cur"]],
                        [Transition(row["name"], 1, row["label"] or NONE, spans, [], look)]))
    return out


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


def _overlaps(a: str, b: str) -> bool:
    if a in b or b in a:
        return True
    m = SequenceMatcher(None, a, b).find_longest_match(0, len(a), 0, len(b))
    return m.size >= max(3, min(len(a), len(b)) // 2)


T = TypeVar("T")


async def _each(runs: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Each coroutine's result, run one after the other (tenants never share a tracker)."""
    return [await run for run in runs]


def score(path: Path, fpr: Fingerprinter) -> Scores:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    s = Scores()
    exact = [0, 0, 0]  # matched, predicted, gold
    overlap = [0, 0, 0]
    sec = [0, 0]
    correct = 0
    tenants = load(path)
    # one event loop and one run for every tenant: a loop each cost ~10% of the scoring, and each run
    # installs and removes a SIGINT handler (~5%)
    answers = asyncio.run(_each(analyse(bodies, fpr, 16) for _, bodies, _ in tenants))
    rows = [(name, results, transitions) for (name, _, transitions), results in zip(tenants, answers, strict=True)]
    for name, results, transitions in rows:
        for t in transitions:
            got = results[t.index]
            predicted = got["cause"] or NONE
            s.transitions += 1
            if predicted == t.label:
                correct += 1
                tp[t.label] += 1
            else:
                fp[predicted] += 1
                fn[t.label] += 1
                s.errors.append(f"{name}[{t.index}] label={t.label} got={predicted} spans={got['spans']} "
                                f"secondary={[f['cause'] for f in got.get('secondary', [])]}")
            found = list(got["spans"]) if predicted == "dynamic_head" else []
            found += [x for f in got.get("secondary", []) if f["cause"] == "dynamic_head" for x in f["spans"]]
            gold = list(t.spans)
            exact[1] += len(found)
            exact[2] += len(gold)
            overlap[1] += len(found)
            overlap[2] += len(gold)
            left = gold[:]
            for x in found:
                if x in left:
                    left.remove(x)
                    exact[0] += 1
            left = gold[:]
            for x in found:
                hit = next((g for g in left if _overlaps(x, g)), None)
                if hit is not None:
                    left.remove(hit)
                    overlap[0] += 1
            if gold and found != gold:
                s.errors.append(f"{name}[{t.index}] span gold={gold} got={found}")
            if t.secondary:
                got_sec = [f["cause"] for f in got.get("secondary", [])]
                sec[1] += len(t.secondary)
                sec[0] += sum(1 for c in t.secondary if c in got_sec)
            if t.lookalike and predicted == "dynamic_head" and t.label != "dynamic_head":
                s.lookalike_false_alarms += 1
    s.accuracy = correct / max(1, s.transitions)
    causes = sorted(set(tp) | set(fp) | set(fn))
    f1s = []
    for c in causes:
        p = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else 0.0
        r = tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else 0.0
        s.per_cause[c] = (p, r, _f1(p, r), tp[c] + fn[c])
        f1s.append(_f1(p, r))
    s.macro_f1 = sum(f1s) / max(1, len(f1s))
    for acc, attr in ((exact, "span_exact_f1"), (overlap, "span_overlap_f1")):
        p = acc[0] / acc[1] if acc[1] else 1.0
        r = acc[0] / acc[2] if acc[2] else 1.0
        setattr(s, attr, _f1(p, r))
    s.secondary_recall = sec[0] / sec[1] if sec[1] else None
    return s


async def _answers(bodies: list[dict], fpr: Fingerprinter, pods: int) -> list[tuple]:
    store = MemoryStore()
    trackers = [TenantTracker(store, show_text=True) for _ in range(pods)]
    out = []
    for i, body in enumerate(bodies):
        inp = prompt_input("chat" if "messages" in body else "completions", body)
        fp = fpr.complete_sync(fpr.prepare(inp, 16))
        obs = await trackers[i % pods].observe("t", fp.block_hashes, build_sketch(inp, fp.text or ""), 16)
        d = obs.diagnosis
        out.append((d.cause, [s.text for s in d.spans], [f.cause for f in d.secondary]) if d else (None, [], []))
    return out


def pod_agreement(path: Path, fpr: Fingerprinter, pods: int) -> tuple[int, int, list[str]]:
    """(answers that differ from one pod's, transitions, which)."""
    differ, total, which = 0, 0, []
    tenants = load(path)
    one_pod = asyncio.run(_each(_answers(bodies, fpr, 1) for _, bodies, _ in tenants))  # one run, as `score` has
    many_pods = asyncio.run(_each(_answers(bodies, fpr, pods) for _, bodies, _ in tenants))
    rows = [(name, len(bodies), one, many)
            for (name, bodies, _), one, many in zip(tenants, one_pod, many_pods, strict=True)]
    for name, n, one, many in rows:
        for i in range(1, n):
            total += 1
            if one[i] != many[i]:
                differ += 1
                which.append(f"{name}[{i}] one pod {one[i]} vs {pods} pods {many[i]}")
    return differ, total, which


def table(name: str, s: Scores) -> str:
    lines = [f"\n{name}: {s.transitions} transitions, accuracy {s.accuracy:.3f}, macro-F1 {s.macro_f1:.3f}, "
             f"span exact-match F1 {s.span_exact_f1:.3f} (overlap {s.span_overlap_f1:.3f}), "
             f"secondary recall {'-' if s.secondary_recall is None else f'{s.secondary_recall:.3f}'}, "
             f"look-alike false alarms {s.lookalike_false_alarms}",
             "| cause | precision | recall | F1 | support |", "|---|---:|---:|---:|---:|"]
    for c, (p, r, f, n) in s.per_cause.items():
        lines.append(f"| {c} | {p:.2f} | {r:.2f} | {f:.2f} | {n} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--split", default=",".join(TUNE_SIDE),
                        help=f"comma-separated, of: {', '.join(CORPORA)} (default: the tune side)")
    parser.add_argument("--errors", action="store_true", help="print each misdiagnosed transition")
    parser.add_argument("--pods", type=int, default=0, help="also compare with N trackers sharing a Store")
    args = parser.parse_args(argv)
    fpr = Fingerprinter(SegmentTokenizer.load())
    try:
        for split in args.split.split(","):
            path = CORPORA[split]
            if not path.exists():
                print(f"\n{split}: {path} missing (build it with its build.py)")
                continue
            s = score(path, fpr)
            print(table(f"{split} ({path.relative_to(ROOT)})", s))
            if args.errors:
                print("\n".join(s.errors))
            if args.pods > 1:
                differ, total, which = pod_agreement(path, fpr, args.pods)
                print(f"{args.pods} pods alternating: {differ} of {total} answers differ from one pod's")
                if args.errors:
                    print("\n".join(which))
    finally:
        fpr.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
