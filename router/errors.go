package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// APIError is an OpenAI-shaped error: what the router answers with, and how
// it reads an engine's error answers.
type APIError struct {
	// Status is the HTTP status to answer with.
	Status int `json:"-"`
	// Message says what went wrong and what to do about it.
	Message string `json:"message"`
	// Type is OpenAI's error type: invalid_request_error, not_found_error,
	// server_error, service_unavailable.
	Type string `json:"type"`
	// Param names the offending request field, if any.
	Param *string `json:"param"`
	// Code is a stable machine-readable code: one of the Code constants
	// (codes_gen.go, generated from api/codes.json), or an engine's own.
	Code string `json:"code"`
}

// Error formats the error as "status code: message".
func (e *APIError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

func badRequest(param, format string, args ...any) *APIError {
	p := param
	e := &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
	if param != "" {
		e.Param = &p
	}
	return e
}

func unavailable(code, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: code, Message: fmt.Sprintf(format, args...)}
}

func serverError(code, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: code, Message: fmt.Sprintf(format, args...)}
}

// body is the error's JSON body: {"error": {...}}.
func (e *APIError) body() []byte {
	b, _ := json.Marshal(struct {
		Error *APIError `json:"error"`
	}{e})
	return b
}

func writeError(w http.ResponseWriter, e *APIError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.body())
}

// engineError reads an engine's non-200 answer as an APIError, keeping its
// status and code; a body that is not OpenAI-shaped becomes the message.
func engineError(status int, data []byte, engine string) *APIError {
	var wrapped struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    any     `json:"code"`
		} `json:"error"`
	}
	e := &APIError{Status: status, Type: "server_error", Code: CodeEngineFailed}
	if json.Unmarshal(data, &wrapped) == nil && wrapped.Error != nil {
		e.Message, e.Param = wrapped.Error.Message, wrapped.Error.Param
		if wrapped.Error.Type != "" {
			e.Type = wrapped.Error.Type
		}
		switch c := wrapped.Error.Code.(type) {
		case string:
			if c != "" {
				e.Code = c
			}
		case float64:
			e.Code = fmt.Sprint(int(c))
		}
	} else {
		e.Message = string(truncate(data, 512))
	}
	e.Message = fmt.Sprintf("engine %s: %s", engine, e.Message)
	return e
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// hexID is what a transfer id looks like (128 random bits in hex).
var hexID = regexp.MustCompile(`[0-9a-fA-F]{32}`)

// redacted is e with the request's transfer id, and anything shaped like
// one, taken out of its message: engines' errors ("KV load of transfer
// <id> failed") are relayed to the client, and a transfer id is the handle
// of a hold, which no client is given. The router's own request ids
// ("cmpl-<hex>", "chatcmpl-<hex>") stay: they are the client's.
func (e *APIError) redacted(transferID string) *APIError {
	msg := e.Message
	if transferID != "" {
		msg = strings.ReplaceAll(msg, transferID, "<transfer>")
	}
	var b strings.Builder
	last := 0
	for _, m := range hexID.FindAllStringIndex(msg, -1) {
		if strings.HasSuffix(msg[:m[0]], "cmpl-") {
			continue
		}
		b.WriteString(msg[last:m[0]])
		b.WriteString("<id>")
		last = m[1]
	}
	b.WriteString(msg[last:])
	out := *e
	out.Message = b.String()
	return &out
}
