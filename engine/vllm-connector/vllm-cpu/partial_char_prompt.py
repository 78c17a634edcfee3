"""Shows, with one vLLM alone, a vLLM 0.32 defect a resume can meet: a streamed completion whose prompt is token
ids ending inside a UTF-8 character (a byte-level BPE token that is half of a character) streams the prompt's own
text back as if it were output.

A resume sends prompt + the tokens generated so far as token ids; when the last generated token ends mid-character
(this random model emits many partial bytes), the engine the request resumes on hits it. The e2e test places its
faults on whole characters for this reason (harness/e2e/vllm_test.go).

    python partial_char_prompt.py http://127.0.0.1:PORT [model]

Exits 1 when the defect shows (the streamed text does not continue the reference), 0 when it does not.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any


def post(base: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60)


def streamed_text(base: str, body: dict[str, Any]) -> str:
    out = []
    for raw in post(base, "/v1/completions", body | {"stream": True}):
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            choices = json.loads(line[6:]).get("choices") or []
            out.extend(c.get("text", "") for c in choices)
    return "".join(out)


def main(argv: list[str]) -> int:
    base, model = argv[1], argv[2] if len(argv) > 2 else "tiny"
    prompt = " ".join(["the little robot read the sky and the river"] * 20)
    greedy = {"model": model, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    ref = json.load(post(base, "/v1/completions", greedy | {"prompt": prompt, "max_tokens": 60}))["choices"][0]
    ids = json.load(post(base, "/tokenize", {"model": model, "prompt": prompt}))["tokens"]
    gen = ref["token_ids"]
    for k in range(1, len(gen) - 8):
        text = json.load(post(base, "/detokenize", {"model": model, "tokens": gen[:k]}))["prompt"]
        if not text.endswith("\ufffd"):
            continue
        # The first k generated tokens end inside a character: ask for the rest with them in the prompt.
        rest = streamed_text(base, greedy | {"prompt": ids + gen[:k], "max_tokens": 8})
        want = json.load(post(base, "/detokenize", {"model": model, "tokens": gen}))["prompt"]
        print(f"prompt ends {k} tokens into the output, inside a character: {text[-12:]!r}")
        print(f"streamed next: {rest[:120]!r}")
        print(f"reference:     {want[len(text) - 1 : len(text) + 40]!r}")
        if rest.startswith(prompt[:40]):
            print("defect: the stream starts with the prompt's own text")
            return 1
        return 0
    print("no output token of this prompt ends inside a character; nothing to show")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
