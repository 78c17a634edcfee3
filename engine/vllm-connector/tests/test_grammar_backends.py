"""A resumed request's grammar goes on exactly where it stopped, on each of vLLM's structured-output backends.

``test_grammar.py`` checks ``connex_vllm.grammar.advance``'s rules with a fake grammar; this file runs it on the real
thing: vLLM's own ``XgrammarBackend``, ``GuidanceBackend`` and ``OutlinesBackend`` (the CPU build's engines in
``TestVLLM`` use xgrammar, and guidance for what xgrammar cannot compile; no engine there runs outlines), compiling
each constraint kind against a byte-level BPE tokenizer made as ``make_model.py`` makes the tiny model's. For each
backend and kind: an answer is drawn under the grammar (seeded random choices among the tokens its bitmask allows,
as a sampler would), the grammar of a "resumed" request is advanced over the first k tokens by ``advance``, and its
next-token bitmask must equal the one of a grammar that sampled those k tokens itself, and it must accept the rest
of the answer and end where the answer ends.
"""

from __future__ import annotations

import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerFast
from vllm.v1.structured_output.backend_guidance import GuidanceBackend
from vllm.v1.structured_output.backend_outlines import OutlinesBackend
from vllm.v1.structured_output.backend_types import StructuredOutputOptions
from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

from connex_vllm import grammar

sys.path.insert(0, str(Path(__file__).parent.parent / "vllm-cpu"))
import make_model

# Bounded everywhere, so a random walk under it ends: outlines ignores an integer's minimum and maximum, hence enum.
JSON_SCHEMA = (
    '{"type": "object", "additionalProperties": false, "required": ["city", "days"], "properties": {'
    '"city": {"type": "string", "pattern": "^[a-z]{3,12}$"}, '
    '"days": {"type": "array", "minItems": 6, "maxItems": 6, "items": {"enum": [1, 22, 333, true]}}}}'
)
REGEX = "Answer:( [a-z]{1,6}){12}\\."
CHOICE = '["first river", "second bright mountain", "third quiet ocean"]'
EBNF = 'root ::= "Go " word (" " word){8} "."\nword ::= [a-z] [a-z]? [a-z]? [a-z]? [a-z]? [a-z]?'
LARK = 'start: "Go " WORD (" " WORD)~8 "."\nWORD: /[a-z]{1,6}/'

# (backend, kind, spec): what each backend compiles in vLLM 0.33 (outlines: json and regex and choice; guidance
# takes Lark where xgrammar takes EBNF).
CASES = [
    (XgrammarBackend, StructuredOutputOptions.JSON, JSON_SCHEMA),
    (XgrammarBackend, StructuredOutputOptions.REGEX, REGEX),
    (XgrammarBackend, StructuredOutputOptions.CHOICE, CHOICE),
    (XgrammarBackend, StructuredOutputOptions.GRAMMAR, EBNF),
    (GuidanceBackend, StructuredOutputOptions.JSON, JSON_SCHEMA),
    (GuidanceBackend, StructuredOutputOptions.REGEX, REGEX),
    (GuidanceBackend, StructuredOutputOptions.CHOICE, CHOICE),
    (GuidanceBackend, StructuredOutputOptions.GRAMMAR, LARK),
    (OutlinesBackend, StructuredOutputOptions.JSON, JSON_SCHEMA),
    (OutlinesBackend, StructuredOutputOptions.REGEX, REGEX),
    (OutlinesBackend, StructuredOutputOptions.CHOICE, CHOICE),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    out = tmp_path_factory.mktemp("tokenizer")
    make_model.make_tokenizer(out, 1024)
    return PreTrainedTokenizerFast.from_pretrained(out)


def _backend(cls: type, tok: PreTrainedTokenizerFast) -> Any:
    # The fields of VllmConfig the backends read; a whole VllmConfig would need a model.
    cfg = types.SimpleNamespace(
        structured_outputs_config=types.SimpleNamespace(
            disable_any_whitespace=True, disable_additional_properties=False
        ),
        model_config=None,
        speculative_config=None,
    )
    return cls(vllm_config=cfg, tokenizer=tok, vocab_size=len(tok))


def _allowed(g: Any, vocab: int) -> list[int]:
    """The tokens g's bitmask allows next (vLLM's packed int32 bitmask, filled as the engine fills it)."""
    mask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    g.fill_bitmask(mask, 0)
    words = mask[0].tolist()
    return [t for t in range(vocab) if (words[t // 32] >> (t % 32)) & 1]


def _draw(g: Any, vocab: int, seed: int, limit: int = 400) -> list[int]:
    """An answer under g, as a sampler draws it: a seeded choice among the allowed tokens (eos among them where the
    grammar may end), until g terminates."""
    rng = random.Random(seed)
    out: list[int] = []
    while not g.is_terminated() and len(out) < limit:
        tok = rng.choice(_allowed(g, vocab))
        assert g.accept_tokens("ref", [tok]), f"the grammar refused its own allowed token {tok}"
        out.append(tok)
    assert g.is_terminated(), f"no end within {limit} tokens"
    return out


@dataclass
class _Structured:
    grammar: Any
    reasoning_ended: bool | None = None


@dataclass
class _Request:
    request_id: str
    prompt_token_ids: list[int]
    structured_output_request: _Structured


@pytest.mark.parametrize(("cls", "kind", "spec"), CASES, ids=lambda v: getattr(v, "__name__", getattr(v, "name", "")))
def test_resumed_grammar_continues_where_it_stopped(
    tokenizer: PreTrainedTokenizerFast, cls: type, kind: StructuredOutputOptions, spec: str
) -> None:
    backend = _backend(cls, tokenizer)
    vocab = len(tokenizer)
    answer = _draw(backend.compile_grammar(kind, spec), vocab, seed=7)
    assert len(answer) >= 4, f"a {len(answer)}-token answer is too short to resume mid-way"
    prompt = tokenizer.encode("Where shall we go next?")
    for k in sorted({1, len(answer) // 2, len(answer) - 1}):
        # The uninterrupted engine: it sampled the first k tokens itself.
        sampled = backend.compile_grammar(kind, spec)
        assert sampled.accept_tokens("ref", answer[:k])
        # The resumed engine: the k tokens sit at the end of the request's prompt.
        resumed = backend.compile_grammar(kind, spec)
        req = _Request("resumed", prompt + answer[:k], _Structured(resumed))
        assert grammar.advance(req, k) == ""
        assert _allowed(resumed, vocab) == _allowed(sampled, vocab), f"k={k}: the next tokens allowed differ"
        assert resumed.accept_tokens("resumed", answer[k:]), f"k={k}: the rest of the answer is refused"
        assert resumed.is_terminated()


@pytest.mark.parametrize("cls", [XgrammarBackend, GuidanceBackend, OutlinesBackend], ids=lambda c: c.__name__)
def test_a_miscounted_resume_is_caught(tokenizer: PreTrainedTokenizerFast, cls: type) -> None:
    """Advancing over one token too many or too few leaves the grammar elsewhere: its next tokens differ from the
    uninterrupted engine's, or it refuses the generated tokens (advance then names resume_refused)."""
    backend = _backend(cls, tokenizer)
    vocab = len(tokenizer)
    # One string only: each position's next tokens are the prefixes of a different rest, so a grammar one token
    # off allows other tokens (a word's letters would not show it: [a-z]{1,6} allows the same after 2 as after 3).
    literal = "first river then second bright mountain then third quiet ocean\\."
    answer = _draw(backend.compile_grammar(StructuredOutputOptions.REGEX, literal), vocab, seed=11)
    k = len(answer) // 2
    prompt = tokenizer.encode("Answer the question.")
    sampled = backend.compile_grammar(StructuredOutputOptions.REGEX, literal)
    assert sampled.accept_tokens("ref", answer[:k])
    for wrong in (k - 1, k + 1):
        resumed = backend.compile_grammar(StructuredOutputOptions.REGEX, literal)
        req = _Request("resumed", prompt + answer[:wrong], _Structured(resumed))
        why = grammar.advance(req, wrong)
        assert why.startswith(grammar.REFUSED) or _allowed(resumed, vocab) != _allowed(sampled, vocab), (
            f"advancing over {wrong} tokens instead of {k} went unnoticed"
        )
