"""A resumed request's grammar goes on from where the interrupted engine left it (connex_vllm.grammar)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from connex_vllm import grammar


@dataclass
class SequenceGrammar:
    """A grammar that allows exactly one token sequence: it shows how far it was advanced, and it rejects a token
    out of place as a real matcher would."""

    allowed: list[int]
    pos: int = 0
    calls: list[tuple[str, list[int]]] = field(default_factory=list)

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        self.calls.append((request_id, list(tokens)))
        for t in tokens:
            if self.pos >= len(self.allowed) or self.allowed[self.pos] != t:
                return False
            self.pos += 1
        return True


@dataclass
class StructuredRequest:
    grammar: Any
    reasoning_ended: bool | None = None


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    structured_output_request: StructuredRequest | None = None


PROMPT = [5, 6, 7, 8]
GENERATED = [40, 41, 42]


def test_advance_feeds_exactly_the_generated_tokens() -> None:
    g = SequenceGrammar(allowed=[*GENERATED, 43, 44])
    r = Request("r1", PROMPT + GENERATED, StructuredRequest(g))
    assert grammar.advance(r, len(GENERATED)) == ""
    assert g.calls == [("r1", GENERATED)]
    assert g.pos == 3  # the next token the engine samples is masked at the state after 42


def test_advance_leaves_unstructured_requests_and_first_legs_alone() -> None:
    assert grammar.advance(Request("r", PROMPT + GENERATED), 3) == ""
    g = SequenceGrammar(allowed=GENERATED)
    assert grammar.advance(Request("r", PROMPT, StructuredRequest(g)), 0) == ""
    assert g.calls == []
    assert not grammar.structured(Request("r", PROMPT))
    assert grammar.structured(Request("r", PROMPT, StructuredRequest(g)))


def test_advance_refuses_what_it_cannot_continue_exactly() -> None:
    # The grammar rejects the tokens (they were not generated under it).
    g = SequenceGrammar(allowed=[1, 2, 3])
    why = grammar.advance(Request("r", PROMPT + GENERATED, StructuredRequest(g)), 3)
    assert why.startswith(grammar.REFUSED) and "rejects" in why
    # More generated tokens than the prompt holds.
    why = grammar.advance(Request("r", PROMPT, StructuredRequest(SequenceGrammar([]))), 4)
    assert why.startswith(grammar.REFUSED) and "not less than" in why
    # The grammar failed to compile, or is not ready.
    for bad in (None, ValueError("bad schema")):
        why = grammar.advance(Request("r", PROMPT + GENERATED, StructuredRequest(bad)), 3)
        assert why.startswith(grammar.REFUSED) and "not ready" in why
    # An engine with a reasoning parser: which tokens the grammar constrains is the reasoner's call.
    g = SequenceGrammar(allowed=GENERATED)
    why = grammar.advance(Request("r", PROMPT + GENERATED, StructuredRequest(g)), 3, reasoning=True)
    assert why.startswith(grammar.REFUSED) and "reasoning" in why and g.calls == []
    # ... unless the reasoning had ended already.
    g = SequenceGrammar(allowed=GENERATED)
    assert grammar.advance(Request("r", PROMPT + GENERATED, StructuredRequest(g, reasoning_ended=True)), 3, True) == ""
