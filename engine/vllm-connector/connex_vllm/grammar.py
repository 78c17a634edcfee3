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

Limit: an engine with a reasoning parser (``--reasoning-parser``) constrains only the tokens after the reasoning ends,
and which of the k tokens those are is the reasoner's call; such a request is refused here (its load fails, and the
engine's ``kv_load_failure_policy`` decides) rather than continued from a guessed state.
"""

from __future__ import annotations

from typing import Any

#: Why a grammar could not be carried over: the reason travels in a failed load's error.
REFUSED = "resume_refused"


def structured(request: Any) -> bool:
    """Whether request carries a structured-output constraint (vLLM's ``structured_output_request``)."""
    return getattr(request, "structured_output_request", None) is not None


def advance(request: Any, generated: int, reasoning: bool = False) -> str:
    """Feeds the last ``generated`` prompt tokens of a resumed request to its grammar; "" when done (or when the
    request has no grammar), else why it could not be (the request must then not run unconstrained).

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
    if reasoning and not so.reasoning_ended:
        return (
            f"{REFUSED}: this engine runs a reasoning parser, and which of the {generated} generated tokens its "
            "grammar constrains is the reasoner's call: the structured request is not continued from a guessed state"
        )
    g = so.grammar
    if g is None or isinstance(g, Exception):
        return f"{REFUSED}: the request's grammar is not ready ({g!r}) when its KV is allocated"
    tokens = prompt[-generated:]
    if not g.accept_tokens(request.request_id, tokens):
        return f"{REFUSED}: the grammar rejects the {generated} tokens generated before the resume"
    return ""
