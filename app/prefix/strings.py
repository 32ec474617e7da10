"""Comparing long strings at C speed, copying only what they share."""

from __future__ import annotations

from collections.abc import Callable, Sequence

PREFIX_PROBE_CHARS = 8192  # first chunk compared when measuring a shared prefix (doubles)
PREFIX_PROBE_MAX = 131072  # ... up to this: the chunk that differs is bisected, copied again


def common_prefix_len(a: str, b: str, a0: int = 0, b0: int = 0) -> int:
    """Length of the common prefix of a[a0:] and b[b0:]: doubling chunks of `b` compared in place
    in `a` (`str.startswith` at an offset), then a bisection inside the first chunk that differs.
    Its cost follows what the two share, not their length: a bisection from the whole length
    copied ~2 MB to find that two 1 MB prompts part after 75 characters. Chunks stop doubling at
    PREFIX_PROBE_MAX: two 1 MB prompts that part at their end bisected a 480K chunk (~15 µs)."""
    n = min(len(a) - a0, len(b) - b0)
    if n <= 0:
        return 0
    lo, step = 0, PREFIX_PROBE_CHARS
    while lo < n:
        hi = min(n, lo + step)
        if not a.startswith(b[b0 + lo:b0 + hi], a0 + lo):
            break
        lo, step = hi, min(step * 2, PREFIX_PROBE_MAX)
    else:
        return n
    while hi - lo > 1:  # a[a0:a0 + lo] == b[b0:b0 + lo]; a[a0:a0 + hi] != b[b0:b0 + hi]
        mid = (lo + hi) // 2
        if a.startswith(b[b0 + lo:b0 + mid], a0 + lo):
            lo = mid
        else:
            hi = mid
    return lo if a[a0 + lo] != b[b0 + lo] else hi


def shared_ends(a: Sequence[str], b: Sequence[str]) -> tuple[int, int]:
    """How many lines two texts' lines share at their start, then at their end (never overlapping):
    what lies between is what changed. Compared as slices (C speed): a long system prompt changed
    in one place costs no Python step per line it kept."""
    head = shared_head(a, b)
    tail = _agreeing(lambda lo, hi: a[len(a) - hi:len(a) - lo] == b[len(b) - hi:len(b) - lo],
                     min(len(a), len(b)) - head)
    return head, tail


def shared_head(a: Sequence[str], b: Sequence[str]) -> int:
    """How many items two lists share at their start, compared as slices (C speed)."""
    return _agreeing(lambda lo, hi: a[lo:hi] == b[lo:hi], min(len(a), len(b)))


def _agreeing(same: Callable[[int, int], bool], n: int) -> int:
    """The most items (n at most) agreeing from the first on, where `same(lo, hi)` says whether items
    lo..hi-1 agree: doubling runs, then a bisection inside the first run that holds a difference."""
    lo, step = 0, 8
    while lo < n:
        hi = min(n, lo + step)
        if not same(lo, hi):
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 1:  # items before lo agree; lo..hi-1 hold a difference
        mid = (lo + hi) // 2
        if same(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


def suffix_opening(a: Sequence[str], b: Sequence[str], first: int = 0) -> int:
    """The least k >= `first` such that a[k:] is how b opens; len(a) when no run but the empty one
    does. A run opens with b[0] and ends with a[-1]: only the k where `a` holds b[0] are compared
    (`list.index`, then slices: C speed)."""
    a, n = list(a), len(a)
    k = max(first, n - len(b)) - 1  # a[k:] longer than b cannot open it
    while b:
        try:
            k = a.index(b[0], k + 1)
        except ValueError:
            break
        if b[n - k - 1] == a[-1] and list(b[:n - k]) == a[k:]:
            return k
    return n
