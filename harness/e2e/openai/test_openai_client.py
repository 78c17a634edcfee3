"""The official OpenAI Python client, unmodified, against the Connex router.

harness/e2e/openai_test.go starts a local cluster (router, prefill and decode
connex-sim engines, each with its connexd) and runs this file with the
virtual environment scripts/test.sh builds:

    CONNEX_ROUTER_URL=http://127.0.0.1:8000 .venv-test/bin/python -m pytest harness/e2e/openai

CONNEX_MODEL names the served model (default "connex-sim").
"""

import os

import openai
import pytest

ROUTER_URL = os.environ.get("CONNEX_ROUTER_URL", "")
MODEL = os.environ.get("CONNEX_MODEL", "connex-sim")
MAX_TOKENS = 12

pytestmark = pytest.mark.skipif(
    not ROUTER_URL, reason="CONNEX_ROUTER_URL is not set (harness/e2e/openai_test.go sets it)"
)


@pytest.fixture(scope="module")
def client():
    # No retries: a failure must show as one, not be papered over.
    c = openai.OpenAI(base_url=ROUTER_URL.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


def test_lists_models(client):
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids, ids


def test_completion(client):
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=MAX_TOKENS)
    assert r.object == "text_completion"
    assert r.model == MODEL
    assert len(r.choices) == 1
    assert r.choices[0].text, r
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == MAX_TOKENS
    assert r.usage.prompt_tokens == len(b"The quick brown fox")


def test_completion_stream_equals_non_stream(client):
    prompt = "Streams and answers agree"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS)
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) == MAX_TOKENS, "one token per chunk"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], finishes
    # include_usage: the last chunk has the usage and no choices.
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something"}], max_tokens=MAX_TOKENS
    )
    assert r.object == "chat.completion"
    assert len(r.choices) == 1
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == MAX_TOKENS


def test_chat_stream_equals_non_stream(client):
    messages = [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "Count the tokens"},
    ]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=MAX_TOKENS)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles[:1] == ["assistant"], roles
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_same_prompt_same_answer(client):
    # The simulated engines are deterministic, whichever decode engine serves.
    answers = {
        client.completions.create(model=MODEL, prompt="Determinism", max_tokens=MAX_TOKENS).choices[0].text
        for _ in range(3)
    }
    assert len(answers) == 1, answers


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_is_4xx(client, stream):
    with pytest.raises((openai.NotFoundError, openai.BadRequestError)) as e:
        r = client.completions.create(model="no-such-model", prompt="hi", max_tokens=2, stream=stream)
        list(r) if stream else None
    assert 400 <= e.value.status_code < 500
    with pytest.raises((openai.NotFoundError, openai.BadRequestError)) as e:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=stream
        )
    assert 400 <= e.value.status_code < 500
    assert "no-such-model" in str(e.value)
