package router

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// keyring is a set of API keys, kept as SHA-256 digests: a presented key is
// hashed and compared with every digest in constant time, so that neither
// the time taken nor an early exit says how much of a key was right, or how
// long the keys are.
type keyring struct{ digests [][sha256.Size]byte }

func newKeyring(keys []string) *keyring {
	k := &keyring{}
	for _, key := range keys {
		if key != "" {
			k.digests = append(k.digests, sha256.Sum256([]byte(key)))
		}
	}
	return k
}

// set says whether any key is configured (no key: the endpoints are open).
func (k *keyring) set() bool { return len(k.digests) > 0 }

// allows reports whether r carries "Authorization: Bearer <one of the keys>".
func (k *keyring) allows(r *http.Request) bool {
	token, ok := bearer(r)
	if !ok || !k.set() {
		return false
	}
	d := sha256.Sum256([]byte(token))
	match := 0
	for i := range k.digests {
		match |= subtle.ConstantTimeCompare(d[:], k.digests[i][:])
	}
	return match == 1
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// unauthorized is the answer without a valid key, shaped as OpenAI's.
func unauthorized(what string) *APIError {
	return &APIError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: CodeUnauthorized,
		Message: "missing or incorrect API key: send \"Authorization: Bearer <key>\" with one of the router's " + what}
}

// isAdminPath is an operator's endpoint: the engine list and the metrics.
func isAdminPath(p string) bool { return strings.HasPrefix(p, "/connex/") || p == "/metrics" }

// guard answers 401 for a /v1/ request without a client key when
// api keys are set, and for an admin request without an admin key when
// admin keys are set; /health and /ready stay open (probes).
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ring *keyring
		var what string
		switch {
		case strings.HasPrefix(r.URL.Path, "/v1/"):
			ring, what = s.apiKeys, "API keys (api_key, api_key_file)"
		case isAdminPath(r.URL.Path):
			ring, what = s.adminKeys, "admin API keys (admin_api_key, admin_api_key_file)"
		}
		if ring != nil && ring.set() && !ring.allows(r) {
			s.metrics.errors.WithLabelValues(CodeUnauthorized).Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="connex"`)
			writeError(w, unauthorized(what))
			return
		}
		next.ServeHTTP(w, r)
	})
}
