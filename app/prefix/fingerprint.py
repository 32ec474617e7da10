"""The fingerprint seam: the rendered prompt as chained token-block hashes.

Hot path contract: `Fingerprinter.prepare()` runs before forwarding and must not do work that
grows with prompt size beyond hashing: it renders the template, splits at special tokens, looks
up memoised segment token ids, and returns a `Fingerprint` whose `block_hashes` cover the leading
segments already known (`complete` False if some segment was a miss). `Fingerprinter.complete()`
runs after the request was forwarded (worker thread for tokenisation) and fills in the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FingerprintMode = str  # "exact" (local tokenizer) | "engine" (/tokenize) | "approx" (char blocks)


@dataclass
class Fingerprint:
    block_size: int
    block_hashes: list[int]  # proxy_chain hashes of leading full blocks known so far
    num_tokens: int | None  # exact prompt tokens when complete, else None
    complete: bool
    mode: FingerprintMode = "exact"
    salt: str | None = None
    estimated_tokens: int = 0  # cheap estimate (chars / 3.5) for bucket/load before tokens exist
    # Opaque material the tracker/diagnosis needs later (segments, rendered text offsets...)
    extra: dict = field(default_factory=dict)
