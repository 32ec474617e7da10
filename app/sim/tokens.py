"""The simulator's tokenizer side: chat rendering + encoding as vLLM does, and the canned output.

Prompt ids must be exactly what a real engine with the same tokenizer would compute (render with
the chat template, encode with add_special_tokens=False for chat), because the prefix cache and
every proxy-side prediction are built on them. Generated tokens are a fixed English filler, cycled,
so that generated blocks are real token ids (they are hashed and cached like vLLM does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from app.prefix.default_tokenizer import DEFAULT_TOKENIZER_DIR
from app.prefix.template import ChatTemplate, load_chat_template
from app.prefix.tokens import SegmentTokenizer

MEMO_BYTES = 64 * 1024 * 1024

FILLER = (
    " The cache is warm when the prefix is stable, and the first token arrives early because"
    " only the new tail of the prompt has to be computed by the engine."
)


class SimTokenizer:
    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else DEFAULT_TOKENIZER_DIR
        self.tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        self.template: ChatTemplate = load_chat_template(directory)
        eos = self.template.special_token_vars.get("eos_token")
        eos_id = self.tokenizer.token_to_id(eos) if eos else None
        self.eos_id: int | None = eos_id
        specials = list(self.template.special_tokens)
        specials += [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]
        # Segment memo: a system prompt shared by many requests is encoded once (exact for
        # tokenizers where added tokens split the text; SegmentTokenizer verifies that at load).
        self.segments = SegmentTokenizer(self.tokenizer, self.template, specials, memo_bytes=MEMO_BYTES,
                                         workers=1, source=str(self.directory))
        self.filler_ids: list[int] = self.tokenizer.encode(FILLER, add_special_tokens=False).ids
        self.filler_text: list[str] = [self.tokenizer.decode([i]) for i in self.filler_ids]

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None,
                    add_generation_prompt: bool = True, **kwargs: Any) -> str:
        return self.template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                    **kwargs)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if add_special_tokens and self.tokenizer.post_processor is not None:
            return list(self.tokenizer.encode(text, add_special_tokens=True).ids)
        out: list[int] = []
        for ids in self.segments.encode_segments(self.segments.split(text)):
            out.extend(ids)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def output_token(self, index: int) -> tuple[int, str]:
        """The index-th generated token id and its text."""
        j = index % len(self.filler_ids)
        return self.filler_ids[j], self.filler_text[j]


@lru_cache(maxsize=4)
def load_tokenizer(directory: str | None = None) -> SimTokenizer:
    """One tokenizer per directory per process (replicas in one process share it; it is
    thread-safe for encode)."""
    return SimTokenizer(directory)
