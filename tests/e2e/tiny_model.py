"""Builds the tiny random-weight Llama the real-vLLM tier serves, in ~5 s, with no downloads.

The tokenizer is prefixgate's built-in default (app/assets/tokenizer: byte-level BPE + ChatML), so
the model, the simulator and the proxy share one vocabulary. Run with the vLLM venv's python:
`.venv-vllm/bin/python tests/e2e/tiny_model.py OUT_DIR`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "app" / "assets" / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build(out: Path) -> Path:
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_DIR / name, out / name)
    vocab = len(json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=8192,
        eos_token_id=2, pad_token_id=0, bos_token_id=None, tie_word_embeddings=False,
        torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
