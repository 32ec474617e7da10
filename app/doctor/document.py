"""The probe document: deterministic filler text of a chosen size, unique per run.

Unique per run because a previous run's cached blocks would fake a warm first call: the nonce
opens the first line *and* seeds the word stream, so two runs share no block past the chat
template's header. Identical across the repeats of one run because the same (nonce, words)
always yields the same string. The endpoint's tokenizer is unknown, so sizes are in words and
`Calibration` maps tokens to words from the engine's own `usage.prompt_tokens`.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field

# Plain English words: about one BPE token each with a leading space on most tokenizers.
_WORDS = (
    "the of and to in is was for on that with as by at from it an be this which or are have has "
    "had not but were his her their its they one all been there when more can will would about "
    "into than other some time only new could these two may first then do any like over such "
    "our after also most made many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three small "
    "large place house water number light river city road garden market table letter morning "
    "evening winter summer music paper story window mountain forest island bridge station engine "
    "signal memory cache block prefix token stream answer question report measure careful simple "
    "quiet steady bright early late strong open closed green blue red silver golden wooden"
).split()

QUESTION = "Question: in one sentence, what is the document above about?"
# Starting guess before the first measurement; the default tokenizer and GPT/Llama-style BPEs
# land between 1.0 and 1.4 tokens per word of this vocabulary.
TOKENS_PER_WORD_GUESS = 1.25


def new_nonce() -> str:
    return secrets.token_hex(8)


def build_document(n_words: int, nonce: str) -> str:
    """~n_words of sentences; the first line names the nonce, the last line asks a question."""
    rng = random.Random(nonce)
    # The nonce leads: the first cache block (template header included) differs between runs.
    lines = [f"{nonce}: a reference document. Read it, then answer the question at the end.", ""]
    words_left = max(n_words, 1)
    paragraph: list[str] = []
    while words_left > 0:
        length = min(rng.randint(8, 18), words_left)
        words = [rng.choice(_WORDS) for _ in range(length)]
        words[0] = words[0].capitalize()
        paragraph.append(" ".join(words) + ".")
        words_left -= length
        if len(paragraph) == 6:
            lines.append(" ".join(paragraph))
            paragraph = []
    if paragraph:
        lines.append(" ".join(paragraph))
    lines += ["", QUESTION]
    return "\n".join(lines)


@dataclass
class Calibration:
    """tokens ≈ per_word·words + overhead, fitted from (words, prompt_tokens) observations.

    One observation gives a ratio (overhead folded in); two or more give a least-squares line, so
    the template's fixed overhead stops skewing long rungs of the ladder.
    """

    points: list[tuple[int, int]] = field(default_factory=list)

    def observe(self, words: int, prompt_tokens: int | None) -> None:
        if prompt_tokens and words > 0:
            self.points.append((words, prompt_tokens))

    def line(self) -> tuple[float, float]:
        """(tokens per word, fixed overhead tokens)."""
        distinct = {w for w, _ in self.points}
        if len(distinct) >= 2:
            n = len(self.points)
            mw = sum(w for w, _ in self.points) / n
            mt = sum(t for _, t in self.points) / n
            var = sum((w - mw) ** 2 for w, _ in self.points)
            slope = sum((w - mw) * (t - mt) for w, t in self.points) / var
            if slope > 0:
                return slope, mt - slope * mw
        if self.points:
            w, t = self.points[-1]
            return t / w, 0.0
        return TOKENS_PER_WORD_GUESS, 0.0

    def words_for(self, tokens: int) -> int:
        per_word, overhead = self.line()
        return max(1, int((tokens - overhead) / per_word))

    def tokens_for(self, words: int) -> int:
        per_word, overhead = self.line()
        return int(round(per_word * words + overhead))
