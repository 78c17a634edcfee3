package simengine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// tokenize serves POST /tokenize as vLLM does: {"model", "prompt"} or
// {"model", "messages"} in, {"count", "max_model_len", "tokens"} out. The
// router counts a text prompt with it before a prefill, to refuse a request
// that cannot fit before it costs one.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &httpError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed", Message: r.Method + " " + r.URL.Path + ": use POST"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeError(w, &httpError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large", Message: fmt.Sprintf("request body over %d bytes", MaxBodyBytes)})
			return
		}
		writeError(w, badRequest("invalid_body", "", "reading the request body: %v", err))
		return
	}
	var in struct {
		Model    string          `json:"model"`
		Prompt   json.RawMessage `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		writeError(w, badRequest("invalid_body", "", "the body must be a JSON object: %v", err))
		return
	}
	if in.Model != "" && in.Model != s.cfg.Model {
		writeError(w, &httpError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist. This engine serves %q.", in.Model, s.cfg.Model)})
		return
	}
	var tokens []uint32
	var herr *httpError
	if len(in.Messages) > 0 {
		tokens, herr = chatTokens(in.Messages)
	} else {
		tokens, herr = promptTokens(in.Prompt)
	}
	if herr != nil {
		writeError(w, herr)
		return
	}
	s.m.tokenize.Inc()
	b, _ := json.Marshal(map[string]any{"count": len(tokens), "max_model_len": s.cfg.MaxModelLen, "tokens": tokens, "token_strs": nil})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
