"""The routing benchmark's trace: agent-style tenants over long static prefixes (deterministic).

Each tenant has a static prefix (system prompt + tool descriptions + documents) of 4k-64k tokens,
heavy-tailed (log-normal, clipped); some tenants open with one of a few shared system prompts.
A tenant's session is a growing conversation: every turn appends a tool-output-like user message
to the previous turns (with a fixed assistant reply from the trace, so every target receives
byte-identical prompts). Sessions start as a Poisson process; turns follow the previous answer
after an exponential think time (closed loop per tenant, as agents behave).

`upper_bound` computes the reuse available with one infinite cache: for each request in start
order, the leading blocks of its prompt already seen in any earlier prompt (vLLM's hit formula).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from app.prefix.blocks import predicted_hit_tokens, proxy_chain
from app.sim.tokens import SimTokenizer

CHARS_PER_TOKEN = 1.87  # measured for the syllable text below with the built-in tokenizer
_SYLLABLES = ["ka", "lo", "mi", "ra", "tu", "ven", "dor", "shi", "pel", "qua", "nox", "zim", "bar", "fen",
              "gul", "tor", "esk", "wyn", "ap", "ul"]


def _text(rng: random.Random, tokens: int) -> str:
    words: list[str] = []
    chars = 0
    target = int(tokens * CHARS_PER_TOKEN)
    while chars < target:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
        words.append(w)
        chars += len(w) + 1
    return " ".join(words)


@dataclass
class Tenant:
    name: str
    start_s: float
    system: str  # shared system prompt (maybe) + tools + documents
    static_tokens: int
    users: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    think_s: list[float] = field(default_factory=list)

    def messages(self, turn: int) -> list[dict[str, str]]:
        """The chat of turn `turn` (0-based): system, then user/assistant pairs, then the user."""
        out = [{"role": "system", "content": self.system}]
        for i in range(turn):
            out.append({"role": "user", "content": self.users[i]})
            out.append({"role": "assistant", "content": self.replies[i]})
        out.append({"role": "user", "content": self.users[turn]})
        return out


@dataclass(frozen=True)
class TraceConfig:
    tenants: int = 48
    min_turns: int = 4
    max_turns: int = 10
    prefix_median_tokens: int = 9000
    prefix_sigma: float = 0.8
    prefix_min_tokens: int = 4000
    prefix_max_tokens: int = 64000
    shared_prompts: int = 3
    shared_share: float = 0.5  # share of tenants opening with a shared system prompt
    shared_tokens: int = 1500
    user_tokens: tuple[int, int] = (100, 600)
    reply_tokens: tuple[int, int] = (40, 120)
    think_mean_s: float = 2.0
    session_rate_per_s: float = 0.5  # Poisson session starts (virtual seconds)
    seed: int = 0


def build_trace(cfg: TraceConfig) -> list[Tenant]:
    rng = random.Random(cfg.seed)
    shared = [f"You are the assistant of organisation {k}. " + _text(rng, cfg.shared_tokens)
              for k in range(cfg.shared_prompts)]
    tenants: list[Tenant] = []
    t = 0.0
    for i in range(cfg.tenants):
        t += rng.expovariate(cfg.session_rate_per_s)
        size = int(min(cfg.prefix_max_tokens, max(cfg.prefix_min_tokens,
                       math.exp(rng.gauss(math.log(cfg.prefix_median_tokens), cfg.prefix_sigma)))))
        head = ""
        if rng.random() < cfg.shared_share:
            head = shared[rng.randrange(cfg.shared_prompts)] + "\n\n"
        own = max(0, size - (cfg.shared_tokens if head else 0))
        system = head + f"Tenant {i} tools and documents:\n" + _text(rng, own)
        turns = rng.randint(cfg.min_turns, cfg.max_turns)
        tenant = Tenant(f"tenant-{i:03d}", t, system, size)
        for _ in range(turns):
            tenant.users.append("tool output: " + _text(rng, rng.randint(*cfg.user_tokens)))
            tenant.replies.append("calling the next tool: " + _text(rng, rng.randint(*cfg.reply_tokens)))
            tenant.think_s.append(rng.expovariate(1.0 / cfg.think_mean_s))
        tenants.append(tenant)
    return tenants


@dataclass
class UpperBound:
    prompt_tokens: int
    reusable_tokens: int

    @property
    def ratio(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def request_order(tenants: list[Tenant]) -> list[tuple[Tenant, int]]:
    """(tenant, turn) in nominal start order (turns of a tenant are spaced by think time)."""
    items = []
    for tenant in tenants:
        at = tenant.start_s
        for turn in range(len(tenant.users)):
            items.append((at, tenant.name, turn, tenant))
            at += tenant.think_s[turn] + 1.0
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    return [(tenant, turn) for _, _, turn, tenant in items]


def upper_bound(tenants: list[Tenant], tokenizer: SimTokenizer, block_size: int) -> UpperBound:
    seen: set[int] = set()
    prompt = reusable = 0
    for tenant, turn in request_order(tenants):
        ids = tokenizer.encode(tokenizer.render_chat(tenant.messages(turn), None, True))
        chain = proxy_chain(ids, block_size)
        lead = 0
        while lead < len(chain) and chain[lead] in seen:
            lead += 1
        prompt += len(ids)
        reusable += predicted_hit_tokens(lead, len(ids), block_size)
        seen.update(chain)
    return UpperBound(prompt, reusable)
