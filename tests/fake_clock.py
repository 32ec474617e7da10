"""A clock a test sets by hand, for code that takes a `clock` callable."""

from __future__ import annotations


class FakeClock:
    """Calling it returns `now`; a test moves it with `clock.now += seconds`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
