"""A resumed request's structured-output state, carried over the tokens generated before the resume.

vLLM compiles a request's grammar (``structured_outputs`` json / regex / choice / grammar / structural tag, or an
OpenAI ``response_format``) when the request is added, and advances it only on tokens it samples itself. A resumed
request reaches the new decode engine as prompt + the k tokens earlier engines generated, so without help its grammar
would start again from the root and the rest of the answer would break the client's constraint. The router says k in
``kv_transfer_params.connex_resume_generated``; before the request's first step on this engine (vLLM calls
``update_state_after_alloc`` once the grammar is compiled: a request waits for it in
``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`` before it is scheduled) the connector feeds those k tokens to the grammar,
exactly as vLLM's own ``accept_tokens`` would have after sampling them. The first token this engine samples is then
masked by the grammar at the state the interrupted engine left it in.

On an engine with a reasoning parser (``--reasoning-parser``, without ``enable_in_reasoning``) vLLM constrains only
the tokens after the reasoning ends: it checks the request's prompt once (``is_reasoning_end``), then each sampled token
(``find_reasoning_end`` for the parser-engine parsers, else ``is_reasoning_end_streaming``), and feeds the grammar from
the token after the end (or from the end itself, when the end is implicit: a tool call's first token). ``advance``
replays exactly that over the k generated tokens with the request's own reasoner — the one vLLM would build for it,
from the same parser and the request's ``reasoning_parser_kwargs`` — and leaves ``reasoning_ended`` as vLLM would
have: True with the grammar advanced past the end, or False when the reasoning goes on (the engine then watches the
next tokens for its end, as it would have).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Builds a request's reasoner (vLLM's ``ReasoningParser``) as vLLM's ``StructuredOutputManager`` would.
ReasonerFor = Callable[[Any], Any]

#: Why a grammar could not be carried over: the reason travels in a failed load's error.
REFUSED = "resume_refused"


def structured(request: Any) -> bool:
    """Whether request carries a structured-output constraint (vLLM's ``structured_output_request``)."""
    return getattr(request, "structured_output_request", None) is not None


def advance(request: Any, generated: int, reasoner_for: ReasonerFor | None = None) -> str:
    """Feeds the last ``generated`` prompt tokens of a resumed request to its grammar; "" when done (or when the
    request has no grammar), else why it could not be (the request must then not run unconstrained).

    ``reasoner_for`` is given on an engine whose grammars wait for the reasoning to end: only the tokens after the
    end (as vLLM would have found it, token by token) reach the grammar.

    Called once per request (the connector clears ``do_remote_prefill`` first), from the scheduler's thread.
    """
    so = getattr(request, "structured_output_request", None)
    if so is None or generated <= 0:
        return ""
    prompt = list(request.prompt_token_ids or [])
    if generated >= len(prompt):
        return (
            f"{REFUSED}: kv_transfer_params.connex_resume_generated={generated} is not less than the prompt's "
            f"{len(prompt)} tokens"
        )
    g = so.grammar
    if g is None or isinstance(g, Exception):
        return f"{REFUSED}: the request's grammar is not ready ({g!r}) when its KV is allocated"
    tokens = prompt[-generated:]
    start = 0
    if reasoner_for is not None and not so.reasoning_ended:
        try:
            end = reasoning_end(reasoner_for(request), prompt[:-generated], tokens, so.reasoning_ended is None)
        except Exception as e:  # a parser that fails here must not leave the request unconstrained
            return f"{REFUSED}: the engine's reasoning parser failed on the generated tokens: {e!r}"
        if end is None:  # still reasoning: the grammar has not started, and the engine watches for the end
            so.reasoning_ended = False
            return ""
        start = end
    if start < len(tokens) and not g.accept_tokens(request.request_id, tokens[start:]):
        return f"{REFUSED}: the grammar rejects the {len(tokens) - start} tokens generated under it before the resume"
    if reasoner_for is not None:
        so.reasoning_ended = True
    return ""


def reasoning_end(reasoner: Any, before: list[int], tokens: list[int], check_prompt: bool) -> int | None:
    """Where the grammar starts among ``tokens`` (sampled one by one after ``before``), as vLLM's
    ``StructuredOutputManager`` decides it: 0 when the prompt already ended the reasoning (checked only while the
    request's ``reasoning_ended`` is unset, as vLLM does), else just after the first token that ends it (at it, for an
    implicit end); None while the reasoning goes on."""
    if check_prompt and reasoner.is_reasoning_end(before):
        return 0
    # The parser-engine parsers say where the reasoning ends, and whether the end token is content.
    find = getattr(reasoner, "find_reasoning_end", None) if getattr(reasoner, "reasoning_end_token_ids", None) else None
    ids = list(before)
    for i, t in enumerate(tokens):
        ids.append(t)
        if find is not None:
            e = find([t])
            if e is not None:
                # vLLM's bounds for the one sampled token: the grammar starts at the end (implicit) or after it; an
                # end past the token (offset == 1: none in it) leaves the reasoning going on.
                start = e.offset if e.implicit else e.offset + 1
                if start <= 1:
                    return i + start
                continue
        if reasoner.is_reasoning_end_streaming(ids, [t]):
            return i + 1
    return None
