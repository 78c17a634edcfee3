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
    reasoner: Any = None
    reasoning_parser_kwargs: dict[str, Any] | None = None


THINK, END_THINK, TOOL = 90, 91, 92


class ThinkReasoner:
    """vLLM's BaseThinkingReasoningParser rules over <think>=90 and </think>=91: the prompt ended the reasoning when
    its last think token is an end; a sampled token ends it when it is the end token."""

    def is_reasoning_end(self, ids: list[int]) -> bool:
        for t in reversed(ids):
            if t == THINK:
                return False
            if t == END_THINK:
                return True
        return False

    def is_reasoning_end_streaming(self, ids: list[int], delta: list[int]) -> bool:
        return END_THINK in delta


@dataclass
class End:
    offset: int
    implicit: bool


class EngineReasoner(ThinkReasoner):
    """A parser-engine parser: it also says where the reasoning ends, and a tool call's first token (92) ends it
    implicitly (the token is content: the grammar starts at it)."""

    reasoning_end_token_ids = (END_THINK, TOOL)

    def find_reasoning_end(self, ids: list[int]) -> End | None:
        # As vLLM's ParserEngine: no end among ids is an end just past them.
        for i, t in enumerate(ids):
            if t == END_THINK:
                return End(i, False)
            if t == TOOL:
                return End(i, True)
        return End(len(ids), False)


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
    # A reasoner that fails: never an unconstrained request.

    class Broken(ThinkReasoner):
        def is_reasoning_end(self, ids: list[int]) -> bool:
            raise RuntimeError("boom")

    broken = Request("r", PROMPT + GENERATED, StructuredRequest(SequenceGrammar([])))
    why = grammar.advance(broken, 3, lambda r: Broken())
    assert why.startswith(grammar.REFUSED) and "boom" in why


def reasoner_for(r: Any) -> Any:
    """As vLLM builds a request's reasoner: once, kept on the request."""
    so = r.structured_output_request
    if so.reasoner is None:
        so.reasoner = ThinkReasoner()
    return so.reasoner


def test_advance_on_a_reasoning_engine_feeds_only_what_follows_the_reasoning() -> None:
    # The reasoning ended inside the generated tokens: the grammar gets the tokens after </think>.
    gen = [50, 51, END_THINK, *GENERATED]
    g = SequenceGrammar(allowed=[*GENERATED, 43])
    r = Request("r", [*PROMPT, THINK, *gen], StructuredRequest(g))
    assert grammar.advance(r, len(gen), reasoner_for) == ""
    assert g.calls == [("r", GENERATED)] and r.structured_output_request.reasoning_ended is True
    # Still reasoning: nothing reaches the grammar, and the engine goes on watching for the end.
    g = SequenceGrammar(allowed=GENERATED)
    r = Request("r", [*PROMPT, THINK, 50, 51, 52], StructuredRequest(g))
    assert grammar.advance(r, 3, reasoner_for) == ""
    assert g.calls == [] and r.structured_output_request.reasoning_ended is False
    # The prompt closed the reasoning before the answer began (as a template with thinking off does): all of it.
    g = SequenceGrammar(allowed=GENERATED)
    r = Request("r", [*PROMPT, THINK, END_THINK, *GENERATED], StructuredRequest(g))
    assert grammar.advance(r, 3, reasoner_for) == ""
    assert g.calls == [("r", GENERATED)] and r.structured_output_request.reasoning_ended is True
    # ... but vLLM checks the prompt only while reasoning_ended is unset (False: it watched the tokens instead).
    g = SequenceGrammar(allowed=GENERATED)
    r = Request("r", [*PROMPT, THINK, END_THINK, *GENERATED], StructuredRequest(g, reasoning_ended=False))
    assert grammar.advance(r, 3, reasoner_for) == "" and g.calls == []
    # A reasoning that had ended (a chat's, resolved by its chat layer): every generated token.
    g = SequenceGrammar(allowed=GENERATED)
    r = Request("r", PROMPT + GENERATED, StructuredRequest(g, reasoning_ended=True))
    assert grammar.advance(r, 3, reasoner_for) == "" and g.calls == [("r", GENERATED)]
    # The end is the last generated token: the grammar starts with the next one, nothing to feed yet.
    g = SequenceGrammar(allowed=GENERATED)
    r = Request("r", [*PROMPT, THINK, 50, END_THINK], StructuredRequest(g))
    assert grammar.advance(r, 2, reasoner_for) == "" and g.calls == []
    assert r.structured_output_request.reasoning_ended is True


def test_advance_follows_a_parser_engine_end() -> None:
    # An explicit end (</think>): after it; an implicit one (a tool call's first token): at it.
    for end, fed in ((END_THINK, [40, 41]), (TOOL, [TOOL, 40, 41])):
        g = SequenceGrammar(allowed=fed)
        r = Request("r", [*PROMPT, 50, end, 40, 41], StructuredRequest(g, reasoner=EngineReasoner()))
        assert grammar.advance(r, 4, reasoner_for) == ""
        assert g.calls == [("r", fed)], end
    # No end among the tokens (vLLM's "an end just past them"): still reasoning, nothing fed.
    g = SequenceGrammar(allowed=[40, 41])
    r = Request("r", [*PROMPT, 50, 51, 40, 41], StructuredRequest(g, reasoner=EngineReasoner()))
    assert grammar.advance(r, 4, reasoner_for) == "" and g.calls == []
    assert r.structured_output_request.reasoning_ended is False
