"""`prefixgate check` (the real console entry point, as a subprocess) against each real SGLang
replica: the radix-cache one reads WORKS, the `--disable-radix-cache` one reads OFF."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.e2e.vllm_server import ROOT

pytestmark = [pytest.mark.e2e_sglang, pytest.mark.timeout(900)]


def _check(url: str) -> tuple[int, dict[str, Any]]:
    # 7000 tokens, four sends: the cold prefill dwarfs the warm calls' jitter on two busy cores
    # (at 2000 tokens a warm call could take 0.8-1.1 s against a 1.3 s cold one and read "unclear")
    cmd = [sys.executable, "-m", "app", "check", url, "--json", "--prompt-tokens", "7000", "--repeats", "4",
           "--no-decode", "--timeout", "120"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return done.returncode, report


@pytest.mark.parametrize("sglang_replica,verdict,code", [("radix", "on", 0), ("noradix", "off", 1)],
                         indirect=["sglang_replica"])
def test_check_works_on_radix_off_on_disabled(sglang_replica: Any, verdict: str, code: int) -> None:
    # On "unclear" the check is run once more, as its own advice for a clock with no clear gain
    # says. CI saw the radix replica's cold 7000-token prefill take 0.50 s in one run against
    # 1.2-1.5 s in six others (the same prefill on the no-radix replica: 0.50-1.74 s; two cores,
    # three replicas), so its warm calls (0.35-0.42 s) were only 1.34x faster. "Unclear" is the
    # right answer to such a trace; the claim is what the check reads when the clock can tell.
    for attempt in (1, 2):
        rc, report = _check(sglang_replica.url)
        print(f"\nprefixgate check {sglang_replica.name} (probe {attempt}): exit {rc}, "
              f"verdict {report['cache_verdict']}, engine {report['engine']}, ttfts {report['ttfts_s']}, "
              f"cached {report['cached_tokens']}, hit rate {report['hit_rate']}, "
              f"caching enabled {report['prefix_caching_enabled']}")
        if report["cache_verdict"] != "unclear":
            break
    assert report["engine"] == "sglang"
    # the timings and the engine's reasons first: pytest cuts a long report short
    seen = (report["ttfts_s"], report["cached_tokens"], report["reasons"])
    assert report["cache_verdict"] == verdict, seen
    assert rc == code, seen
