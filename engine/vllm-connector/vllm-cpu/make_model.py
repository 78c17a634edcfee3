"""Makes the tiny random-weight Llama model and tokenizer that `make run-vllm` and the real-vLLM tests serve.

No model hub is reachable from CI, so the project makes its own model: a ``LlamaForCausalLM`` with random
weights from a fixed seed and a byte-level BPE tokenizer trained on a seeded synthetic corpus. The same
arguments give the same files byte for byte, so greedy output is the same on every machine.

    python make_model.py OUT_DIR [--size tiny|small|sliding]

``tiny`` (the default: hidden 256, 2 layers, 4 heads, 2 KV heads, head size 64, vocab 2048, ~2 M parameters)
keeps three ``vllm serve`` instances within a 2-core VM; ``small`` (hidden 1024, 8 layers, 8 heads, 4 KV heads,
head size 128, ~120 M parameters) makes prefill long enough to see in ``make bench-vllm``; ``sliding`` is tiny with 4
layers alternating sliding-window (64 tokens) and full attention, as Gemma, gpt-oss and Mistral's sliding models
are: vLLM serves it with its hybrid KV cache manager (two KV cache groups). The directory is
written atomically (a temporary sibling renamed into place) and left alone when it already holds a model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Size:
    """A model's shape."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int
    sliding_window: int = 0  # tokens; > 0: every other layer (from the first) reads only this many back


SIZES = {
    "tiny": Size(hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, vocab=2048, max_positions=4096),
    "small": Size(hidden=1024, layers=8, heads=8, kv_heads=4, intermediate=2816, vocab=2048, max_positions=8192),
    "sliding": Size(
        hidden=256, layers=4, heads=4, kv_heads=2, intermediate=512, vocab=2048, max_positions=4096, sliding_window=64
    ),
}

SEED = 20261203
#: What make() writes changes with this: a directory made by another version (or none, before it was recorded) is
#: made again. 2: the reasoning and tool-call markers became special tokens.
VERSION = 2
#: Markers a reasoning parser looks up in the vocabulary, as single special tokens: Gemma 4's channel and tool-call
#: tokens (`make run-vllm` runs `--reasoning-parser gemma4`, which thinks only when a chat asks for it) and the
#: <think> pair of the Qwen3 and DeepSeek-R1 parsers.
REASONING_TOKENS = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<think>", "</think>"]
# Words the synthetic corpus is made of: enough variety for a BPE vocabulary of 2048 and for prompts to
# tokenize into many tokens.
_WORDS = (
    "the a an of to in on at for with from by about into over after before under between through during "
    "model token cache block prefill decode engine request stream resume router cluster node memory layer "
    "once upon time there was little robot who lived city far away every morning it woke up and looked sky "
    "river mountain forest ocean garden library market station bridge tower castle village kitchen window "
    "red blue green yellow silver golden quiet loud bright dark warm cold fast slow old new small large "
    "run walk read write sing dance build break open close think dream learn teach find lose give take "
    "one two three four five six seven eight nine ten hundred thousand first second last next many few"
).split()


def corpus(n_lines: int, rng: random.Random) -> list[str]:
    """Seeded sentences with punctuation and digits, so the tokenizer sees every byte class."""
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        s = " ".join(words)
        lines.append(s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ";"]))
    return lines


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(out: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer trained on the seeded corpus, saved as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|eos|>", "<|pad|>", *REASONING_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(20000, random.Random(SEED)), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_weights(out: Path, size: Size, vocab: int, bos: int, eos: int, pad: int) -> None:
    """A random-weight LlamaForCausalLM from a fixed seed, fp32 safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        head_dim=size.hidden // size.heads,
        max_position_embeddings=size.max_positions,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
        # Weights ten times the usual spread make the random model chaotic: its greedy output varies token by
        # token and depends on every earlier token, so a KV block moved wrong shows in the text.
        initializer_range=0.1,
        torch_dtype="float32",
    )
    if size.sliding_window:
        # vLLM's Llama reads per-layer windows from layer_types (model_executor/models/llama.py).
        cfg.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(size.layers)]
        cfg.sliding_window = size.sliding_window
    model = LlamaForCausalLM(cfg)
    # Larger-than-default logits spread makes greedy choices well separated (no near ties that float
    # rounding between batched and one-by-one kernels could flip).
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(out, safe_serialization=True)


def current(out: Path, size_name: str) -> bool:
    """Whether out holds the model this version of make() writes for size_name."""
    try:
        made = json.loads((out / "connex-model.json").read_text())
    except (OSError, ValueError):
        return False
    return made.get("version") == VERSION and made.get("size") == size_name and (out / "config.json").exists()


def make(out: Path, size_name: str) -> Path:
    """Writes the model into out unless it is already there (made by this version); returns out."""
    if current(out, size_name):
        return out
    size = SIZES[size_name]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        make_tokenizer(tmp, size.vocab)
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(tmp)
        make_weights(tmp, size, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
        (tmp / "connex-model.json").write_text(json.dumps({"size": size_name, "seed": SEED, "version": VERSION}) + "\n")
        if out.exists():  # made by another version: set aside, then removed once the new one is in place
            old = out.with_name(f"{out.name}.old.{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="model directory to create (left alone if it already holds this version's)")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    a = ap.parse_args(argv)
    print(make(a.out, a.size))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
