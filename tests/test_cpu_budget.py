"""The diagnoses' share of a core (app/cpu_budget.py): a bucket of CPU seconds on a fake clock."""

from __future__ import annotations

import threading

from app.cpu_budget import CpuBudget
from tests.fake_clock import FakeClock


def test_work_runs_until_the_burst_is_spent_then_at_the_share_of_a_core() -> None:
    clock = FakeClock(100.0)
    budget = CpuBudget(0.25, burst_s=2.0, clock=clock)  # 0.5 CPU-s of burst, refilled 0.25 s per s
    ran = 0
    while budget.allows():
        budget.charge(0.125)  # (binary fractions: the sums are exact)
        ran += 1
    assert ran == 4  # the burst: 0.5 CPU-s of 0.125 s jobs
    clock.now += 0.5  # refills 0.125 s: one more job
    assert budget.allows()
    budget.charge(0.125)
    assert not budget.allows()
    # over 128 s of 0.125 s jobs offered every 0.125 s, those started cost a quarter of a core
    spent = 0.0
    for _ in range(1024):
        clock.now += 0.125
        if budget.allows():
            budget.charge(0.125)
            spent += 0.125
    assert spent == 32.0


def test_a_long_job_takes_the_bucket_below_zero_and_what_follows_waits_for_the_refill() -> None:
    clock = FakeClock(100.0)
    budget = CpuBudget(0.5, burst_s=2.0, clock=clock)
    assert budget.allows()
    budget.charge(3.0)  # one job of 3 s against a bucket of 1 s: 2 s in debt
    clock.now += 3.9
    assert not budget.allows()  # 1.95 s refilled: still below zero
    clock.now += 0.2
    assert budget.allows()


def test_an_idle_spell_refills_no_more_than_the_burst() -> None:
    clock = FakeClock(100.0)
    budget = CpuBudget(0.5, burst_s=2.0, clock=clock)
    clock.now += 3600
    ran = 0
    while budget.allows():
        budget.charge(0.25)
        ran += 1
    assert ran == 4  # 1 CPU-s, not an hour's refill


def test_a_share_of_zero_runs_nothing() -> None:
    clock = FakeClock(100.0)
    budget = CpuBudget(0.0, clock=clock)
    assert not budget.allows()
    clock.now += 1000
    assert not budget.allows()


def test_charges_from_other_threads_are_all_counted() -> None:
    clock = FakeClock(100.0)
    job = 2.0 ** -10
    budget = CpuBudget(1.0, burst_s=10_000 * job, clock=clock)  # ~9.8 CPU-s, what the jobs below take

    def work() -> None:
        for _ in range(2000):
            budget.charge(job)
            budget.allows()

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not budget.allows()  # 5 x 2000 jobs charged: the bucket is exactly empty
    clock.now += job
    assert budget.allows()
