"""Presenting a CheckResult: a rich table for people, one JSON object for scripts, and progress bars.

The JSON keys `cache_verdict`, `cold_ttft_s`, `warm_ttft_s`, `hit_rate`, `decode_tps`, `prefill_s`
and `ceiling_tokens` are a contract (issue 10); more keys may be added, none renamed.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.doctor.check import CheckResult

VERDICT_STYLE = {"on": "bold green", "off": "bold red", "unclear": "bold yellow"}
NAIVE_AGREES = 1.5  # within this factor the per-event rate is not misleading
VERDICT_TEXT = {"on": "WORKS (one step down, then flat)", "off": "OFF", "unclear": "UNCLEAR"}


def _finite(value: float | None, digits: int = 4) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def to_json(result: CheckResult) -> dict[str, Any]:
    cache = result.cache
    decode = result.decode
    counters = result.counters
    return {
        "url": result.url,
        "model": result.model,
        "engine": result.engine,
        "measured": result.measured,
        "refused": result.refused,
        "exit_code": result.exit_code,
        "cache_verdict": cache.verdict if cache else None,
        "cold_ttft_s": _finite(cache.cold_ttft_s) if cache else None,
        "warm_ttft_s": _finite(cache.warm_ttft_s) if cache else None,
        "ttft_ratio": _finite(cache.ratio, 2) if cache else None,
        "ttfts_s": [_finite(t) for t in result.ttfts],
        "hit_rate": _finite(counters.hit_rate) if counters else None,
        "cache_queries_tokens": counters.queries if counters else None,
        "cache_hits_tokens": counters.hits if counters else None,
        "cached_tokens": result.cached_tokens,
        "per_request_metrics": result.per_request_metrics,
        "block_size": result.block_size,
        "prefix_caching_enabled": result.prefix_caching_enabled,
        "prompt_tokens": result.prompt_tokens,
        "decode_tps": _finite(decode.decode_tps, 2) if decode else None,
        "prefill_s": _finite(decode.prefill_s) if decode else None,
        "naive_decode_tps": _finite(result.naive_decode_tps, 1),
        "two_point": None if decode is None else {
            str(p.max_tokens): {"median_s": _finite(p.median_s), "spread": _finite(p.spread, 3),
                                "completion_tokens": list(p.completion_tokens), "consistent": p.consistent}
            for p in (decode.short, decode.long)
        },
        "ceiling_tokens": result.ladder.ceiling_tokens if result.ladder else None,
        "ladder_stopped": result.ladder.stopped if result.ladder else None,
        "ladder": [
            {"target_tokens": s.target_tokens, "prompt_tokens": s.prompt_tokens, "outcome": s.outcome,
             "detail": s.detail, "seconds": _finite(s.seconds)}
            for s in result.ladder_steps
        ],
        "max_model_len": result.max_model_len,
        "reasons": list(cache.reasons) if cache else [],
        "likely_causes": list(cache.causes) if cache else [],
        "warnings": result.warnings,
        "problems": result.problems,
    }


def _s(value: float | None, unit: str = "s") -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3f} {unit}"


def _naive_note(naive: float, two_point: float | None) -> str:
    """Why the per-event rate is shown at all: it is the measurement that fools people."""
    method = "one token per SSE event, timed by arrival"
    if not two_point:
        return method
    factor = max(naive / two_point, two_point / naive)
    if factor < NAIVE_AGREES:
        return f"{method}: agrees with the two-point rate"
    return f"{method}: {factor:.0f}x off the two-point rate — the server batches deltas; ignore it"


def render(result: CheckResult, console: Console) -> None:
    """The human report: one table of findings, then causes, warnings and the bottom line."""
    title = f"prefixgate check {result.url}  model={result.model or '?'}  engine={result.engine or '?'}"
    if not result.measured:
        console.print(f"[bold]{title}[/bold]")
        console.print(f"[bold yellow]Could not measure:[/bold yellow] {result.refused}")
        return
    table = Table(title=title, show_lines=False, title_justify="left")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    cache = result.cache
    if cache is not None:
        table.add_row("prefix cache", f"[{VERDICT_STYLE[cache.verdict]}]{VERDICT_TEXT[cache.verdict]}[/]",
                      "; ".join(r for r in cache.reasons if r))
        trace = "  ".join(f"{t:.3f}" for t in result.ttfts)
        ratio = f"{cache.ratio:.1f}x" if cache.ratio else "—"
        table.add_row("TTFT cold → warm", f"{_s(cache.cold_ttft_s)} → {_s(cache.warm_ttft_s)} ({ratio})",
                      f"calls: {trace} s; prompt {result.prompt_tokens or '?'} tokens")
    counters = result.counters
    if counters is not None:
        rate = f"{counters.hit_rate:.1%}" if counters.hit_rate is not None else "not measurable"
        table.add_row("engine hit rate", rate,
                      f"{counters.hits:.0f} of {counters.queries:.0f} tokens looked up during the probe")
    else:
        table.add_row("engine hit rate", "—", "the endpoint exposes no prefix-cache counters")
    config = []
    if result.block_size:
        config.append(f"block size {result.block_size}")
    if result.prefix_caching_enabled is not None:
        config.append(f"enable_prefix_caching={result.prefix_caching_enabled}")
    if config:
        table.add_row("cache config", ", ".join(config), "")
    if result.per_request_metrics is not None:
        table.add_row("per-request metrics", "yes" if result.per_request_metrics else "no",
                      "the engine's queue and prefill time per answer (vLLM --enable-per-request-metrics)")
    decode = result.decode
    if decode is not None:
        spreads = "  ".join(
            f"{p.max_tokens} tok: {p.median_s:.3f} s (spread {p.spread or 0:.2f})" for p in (decode.short, decode.long)
        )
        tps = f"{decode.decode_tps:.1f} tok/s" if decode.decode_tps else "—"
        table.add_row("decode (two-point)", tps, spreads)
        cached = cache is not None and cache.verdict == "on"
        table.add_row("prefill (intercept)", _s(decode.prefill_s),
                      "the same prompt again, served from cache" if cached else "the same prompt again")
        if result.naive_decode_tps is not None:
            table.add_row("naive per-event rate", f"{result.naive_decode_tps:,.0f} tok/s",
                          _naive_note(result.naive_decode_tps, decode.decode_tps))
    if result.ladder is not None:
        rungs = ", ".join(
            f"{s.prompt_tokens or s.target_tokens}:{s.outcome}" for s in result.ladder_steps
        )
        ceiling = f"{result.ladder.ceiling_tokens} tokens" if result.ladder.ceiling_tokens else "none passed"
        table.add_row("context ceiling", ceiling, f"{result.ladder.stopped}; rungs {rungs}")
    console.print(table)
    if cache is not None and cache.causes:
        console.print("[bold]Likely causes:[/bold]")
        for cause in cache.causes:
            console.print(f"  • {cause}")
    for warning in result.warnings:
        console.print(f"[bold yellow]WARNING[/bold yellow] {warning}")
    if result.problems:
        console.print("[bold red]Problems:[/bold red] " + "; ".join(result.problems))
    else:
        console.print("[bold green]Healthy.[/bold green]")


class RichProgress:
    """Progress bars on stderr, one task per stage (a `check.ProgressSink`)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console, transient=False)
        self._task: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def stage(self, label: str, total: int) -> None:
        self._task = self._progress.add_task(label, total=total)

    def advance(self) -> None:
        if self._task is not None:
            self._progress.advance(self._task)
