"""A real headless browser for the UI tests: Debian's `chromium` (scripts/install-tools.sh).

`dump_dom(url)` returns the DOM *after* the page's scripts ran (chromium --dump-dom with a
virtual-time budget, which waits for the page's fetches), parsed into a small tree (`Node`) that
tests query by tag, class and attribute; `screenshot(url, path)` writes a PNG. Each call uses a
fresh profile directory, removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = os.environ.get("PREFIXGATE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
BUDGET_MS = 5000  # virtual time the page gets: its fetches and first render take well under it


def require_chromium() -> str:
    if not os.path.exists(CHROMIUM):
        raise AssertionError(f"{CHROMIUM} not found: run scripts/install-tools.sh (apt package chromium)")
    return CHROMIUM


def _run(args: list[str], timeout: float = 90.0) -> str:
    profile = tempfile.mkdtemp(prefix="pg-chromium-")
    try:
        cmd = [require_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
               "--hide-scrollbars", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


@dataclass
class Node:
    tag: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.walk()

    def find_all(self, tag: str | None = None, cls: str | None = None,
                 where: Callable[[Node], bool] | None = None, **attrs: str) -> list[Node]:
        out = []
        for n in self.walk():
            if tag is not None and n.tag != tag:
                continue
            if cls is not None and cls not in n.classes():
                continue
            if any(n.attrs.get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            if where is not None and not where(n):
                continue
            out.append(n)
        return out

    def one(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, cls, **attrs)
        assert len(found) == 1, f"expected one <{tag} class={cls} {attrs}>, found {len(found)}"
        return found[0]

    def by_id(self, ident: str) -> Node:
        return self.one(id=ident)


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document")
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


def dump_dom(url: str, budget_ms: int = BUDGET_MS) -> tuple[str, Node]:
    """The serialized DOM after the scripts ran, and its parsed tree."""
    html = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url])
    return html, parse(html)


def screenshot(url: str, path: Path, size: tuple[int, int] = (1400, 1500), budget_ms: int = BUDGET_MS) -> Path:
    _run([f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={budget_ms}",
          f"--screenshot={path}", url])
    assert path.exists() and path.stat().st_size > 10_000, f"no screenshot at {path}"
    return path
