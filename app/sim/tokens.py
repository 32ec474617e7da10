"""The simulator's tokenizer side: chat rendering + encoding as vLLM does, and the canned output.

Prompt ids must be exactly what a real engine with the same tokenizer computes: render with the
chat template (app/sim/chat_template.py), encode with the Hugging Face `tokenizers` library,
`add_special_tokens=False` for chat. This is the simulator's own code, not the gateway's
(app/prefix/tokens.py): an oracle must not share the code it checks (docs/testing-oracles.md).
Generated tokens are a fixed English filler, cycled, so that generated blocks are real token ids
(they are hashed and cached like vLLM does).

Long prompts repeat (a system prompt shared by many requests), so encoding is memoised per
segment: `tokenizers` extracts every added token before it normalises and pre-tokenises the text
between them, so the ids of a text are the concatenation of its segments' ids. That holds only
when no added token strips its neighbours or matches normalised text, and no pre-tokenizer
treats the start of the text specially (Metaspace); otherwise the whole text is encoded at once.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from app.sim.chat_template import HfChatTemplate

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
MEMO_BYTES = 64 * 1024 * 1024
MEMO_MIN_CHARS = 256
CONTINUE_MAX_CHARS = 64 * 1024  # a completions continuation is looked for in the prompt's last chars  # a shorter text is encoded whole (cheaper than splitting it)

FILLER = (
    " The cache is warm when the prefix is stable, and the first token arrives early because"
    " only the new tail of the prompt has to be computed by the engine."
)


class _SegmentMemo:
    """segment text -> ids, LRU-bounded by characters, thread-safe (replicas share a tokenizer)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self.items: OrderedDict[str, list[int]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, text: str) -> list[int] | None:
        with self.lock:
            ids = self.items.get(text)
            if ids is not None:
                self.items.move_to_end(text)
            return ids

    def put(self, text: str, ids: list[int]) -> None:
        if len(text) > self.max_chars:
            return
        with self.lock:
            if text in self.items:
                return
            self.items[text] = ids
            self.chars += len(text)
            while self.chars > self.max_chars:
                old, _ = self.items.popitem(last=False)
                self.chars -= len(old)


def _splitter(directory: Path, tokenizer: Tokenizer) -> re.Pattern[str] | None:
    """A pattern that cuts a text at its added tokens, or None when cutting is not exact."""
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    if "Metaspace" in json.dumps(spec.get("pre_tokenizer")):
        return None
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") or t.get("normalized") for t in added):
        return None
    contents = sorted({t["content"] for t in added if t.get("content")}, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, contents)) + ")") if contents else None


class SimTokenizer:
    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else DEFAULT_TOKENIZER_DIR
        self.tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        self.template = HfChatTemplate(self.directory)
        eos = self.template.variables.get("eos_token")
        self.eos_id: int | None = self.tokenizer.token_to_id(eos) if eos else None
        self._split = _splitter(self.directory, self.tokenizer)
        self._memo = _SegmentMemo(MEMO_BYTES // 4)
        self.filler_ids: list[int] = self.tokenizer.encode(FILLER, add_special_tokens=False).ids
        self.filler_text: list[str] = [self.tokenizer.decode([i]) for i in self.filler_ids]

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None,
                    add_generation_prompt: bool = True, strip_billing: bool = True, engine: str = "vllm",
                    **kwargs: Any) -> str:
        """The prompt text of a chat request, as `engine` ("vllm" or "sglang") renders it
        (`strip_billing`: vLLM drops a system text's billing-header line; SGLang keeps it)."""
        return self.template.render(messages, tools, add_generation_prompt, strip_billing, engine, **kwargs)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if add_special_tokens or self._split is None or len(text) < MEMO_MIN_CHARS:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
        segments = [s for s in self._split.split(text) if s]
        known = {s: ids for s in set(segments) if (ids := self._memo.get(s)) is not None}
        missing = [s for s in set(segments) if s not in known]
        if missing:  # one call into the tokenizer for every segment not seen yet
            for segment, enc in zip(missing, self.tokenizer.encode_batch(missing, add_special_tokens=False),
                                    strict=True):
                known[segment] = list(enc.ids)
                self._memo.put(segment, known[segment])
        return [i for s in segments for i in known[s]]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def continued_tokens(self, text: str, whole: bool) -> int:
        """How many canned output tokens a continuation request already holds: the filler's first
        k tokens are the whole final assistant message (`whole`, chat `continue_final_message`)
        or the end of a completions prompt. 0 when they are not. The simulated engine continues
        the canned answer from token k, as a greedy real engine continues its own answer."""
        if not text:
            return 0
        if whole:
            return self._filler_prefix_tokens(text)
        first = self.filler_text[0]
        start = text.rfind(first, max(0, len(text) - CONTINUE_MAX_CHARS))
        best = 0
        while start >= 0:  # leftmost filler start whose tail is all filler: the longest continuation
            k = self._filler_prefix_tokens(text[start:])
            if k:
                best = k
            start = text.rfind(first, max(0, len(text) - CONTINUE_MAX_CHARS), start)
        return best

    def _filler_prefix_tokens(self, text: str) -> int:
        """k when `text` is exactly the canned output's first k tokens, else 0."""
        pos = k = 0
        n = len(self.filler_text)
        while pos < len(text):
            piece = self.filler_text[k % n]
            if not text.startswith(piece, pos):
                return 0
            pos += len(piece)
            k += 1
        return k

    def output_token(self, index: int) -> tuple[int, str]:
        """The index-th generated token id and its text."""
        j = index % len(self.filler_ids)
        return self.filler_ids[j], self.filler_text[j]


@lru_cache(maxsize=4)
def load_tokenizer(directory: str | None = None) -> SimTokenizer:
    """One tokenizer per directory per process (replicas in one process share it; it is
    thread-safe for encode)."""
    return SimTokenizer(directory)
