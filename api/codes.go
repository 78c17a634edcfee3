package api

import (
	"errors"
	"fmt"
)

// Code is a stable numeric error code sent in the Nats-Service-Error-Code
// header. Codes never change meaning; new failures get new codes.
type Code int

//go:generate go run ./gencodes

// The constants and names of the error table are generated from
// codes.json (codes_gen.go), the one table every language shares: it also
// writes the router's codes, the shims' load-failure reasons (Go and
// Python) and docs/api.md's tables. Edit it, then run `make generate`.

// Name is the code's stable name, e.g. "expired".
func (c Code) Name() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("code_%d", int(c))
}

// Error is an API failure with its stable code. Handlers return it; clients
// decode it from the reply headers.
type Error struct {
	Code Code
	Msg  string
	// Cause is the error behind a code the client itself decided (NATS'
	// "no responders", a timeout), for errors.Is; nil for a code the member
	// answered with.
	Cause error
}

// Error formats the error as "name (code): message", the form logs and
// shims print.
func (e *Error) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code.Name(), int(e.Code), e.Msg) }

// Unwrap returns Cause.
func (e *Error) Unwrap() error { return e.Cause }

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf is the API code of err: an *Error's own (anywhere in its chain), 0
// for nil, CodeInternal for anything else. On the serving side, domain
// errors get their codes from package errcode (ServeOptions.Errors).
func CodeOf(err error) Code {
	var ae *Error
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ae):
		return ae.Code
	}
	return CodeInternal
}

// AsError converts any error into an *Error with the mapped code.
func AsError(err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	return &Error{Code: CodeOf(err), Msg: err.Error()}
}
