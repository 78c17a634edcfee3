// Code generated from api/codes.json by `go generate ./api` (api/gencodes); DO NOT EDIT.

package router

// The router's error codes (APIError.Code): what it answers with, and the
// engines' codes it acts on. Clients branch on these strings; they never
// change meaning.
const (
	CodeInvalidRequest = "invalid_request"         // 400: the request is not one the router accepts (malformed JSON, an unknown or repeated key, a field out of range); param names the field
	CodeContextLength  = "context_length_exceeded" // 400: prompt + max_tokens is longer than the model's limit (max_model_len in /v1/models); the message names both, param the field to shorten (OpenAI's code)
	CodeUnauthorized   = "invalid_api_key"         // 401: no valid API key (api_key* on /v1/*, admin_api_key* on /connex/v1/* and /metrics)
	CodeModelNotFound  = "model_not_found"         // 404: no live engine serves the model; GET /v1/models lists those that do
	CodeNotFound       = "not_found"               // 404: no such route
	CodeMethod         = "method_not_allowed"      // 405: the route exists under another method; the message names it
	CodeBodyTooLarge   = "request_too_large"       // 413: the request body is over router_max_body_bytes
	CodeEngineFailed   = "engine_failed"           // 502, 503, or the engine's own: an engine failed, could not be reached or answered something unusable (an engine's error without a code of its own is relayed under this one), or the router is shutting down
	CodeKVLoadFailed   = "kv_load_failed"          // the engine's (503): the decode engine could not load the prefilled KV and its kv_load_failure_policy is fail: relayed, never retried on another engine
	CodeResumeFailed   = "resume_failed"           // 502, 503: a decode engine failed mid-request and no resume succeeded (none left, or router_max_resumes reached)
	CodeResumeRefused  = "resume_refused"          // 502: a decode engine failed mid-request and the request cannot be resumed into the same answer (the message names why: tool calls, logprobs, a seeded sampler, reasoning, output-dependent penalties, bad_words); ended rather than answered differently
	CodeNoEngine       = "no_engine"               // 503: the model has no live prefill and decode engine pair right now; retry later
	CodeOverloaded     = "overloaded"              // 503: the router runs router_max_in_flight requests already; retry after Retry-After; mirrors NATS code 429 (overloaded)
)

// routerCodes is every code above: the values connex_router_errors_total's
// code label may take (codeLabel).
var routerCodes = []string{
	CodeInvalidRequest,
	CodeContextLength,
	CodeUnauthorized,
	CodeModelNotFound,
	CodeNotFound,
	CodeMethod,
	CodeBodyTooLarge,
	CodeEngineFailed,
	CodeKVLoadFailed,
	CodeResumeFailed,
	CodeResumeRefused,
	CodeNoEngine,
	CodeOverloaded,
}
