package api

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Content types. A request without a Content-Type header is protobuf.
const (
	HeaderContentType = "Content-Type"
	ContentProtobuf   = "application/protobuf"
	ContentJSON       = "application/json"
)

// Headers NATS micro uses for errors.
const (
	HeaderErrorCode = "Nats-Service-Error-Code"
	HeaderError     = "Nats-Service-Error"
)

// contentType returns whether the payload is JSON, or an error for an
// unsupported content type.
func contentType(h micro.Headers) (bool, *Error) {
	ct := strings.TrimSpace(strings.ToLower(h.Get(HeaderContentType)))
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = strings.TrimSpace(ct[:i])
	}
	switch ct {
	case "", ContentProtobuf, "application/x-protobuf":
		return false, nil
	case ContentJSON:
		return true, nil
	}
	return false, Errorf(CodeBadContentType, "content type %q: use %s or %s", ct, ContentProtobuf, ContentJSON)
}

// Unmarshal decodes data into m as JSON or protobuf, within maxBytes.
func Unmarshal(data []byte, isJSON bool, maxBytes int, m proto.Message) *Error {
	if len(data) > maxBytes {
		return Errorf(CodeTooLarge, "payload of %d bytes exceeds max_request_bytes=%d", len(data), maxBytes)
	}
	var err error
	if isJSON {
		err = protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(data, m)
	} else {
		err = proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, m)
	}
	if err != nil {
		kind := "protobuf"
		if isJSON {
			kind = "JSON"
		}
		return Errorf(CodeMalformed, "decode %s %s: %v", kind, m.ProtoReflect().Descriptor().Name(), err)
	}
	return nil
}

// Marshal encodes m as JSON or protobuf.
func Marshal(m proto.Message, isJSON bool) ([]byte, error) {
	if isJSON {
		return protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	}
	return proto.Marshal(m)
}

// respondError answers req with e's code in the micro error headers and a
// small JSON body for clients that only read payloads.
func respondError(req micro.Request, e *Error) error {
	body, _ := json.Marshal(struct {
		Code  int    `json:"code"`
		Name  string `json:"name"`
		Error string `json:"error"`
	}{int(e.Code), e.Code.Name(), e.Msg})
	return req.Error(strconv.Itoa(int(e.Code)), e.Msg, body, micro.WithHeaders(micro.Headers{HeaderContentType: {ContentJSON}}))
}

// decodeErrorHeaders turns a micro error reply into an *Error, or nil.
func decodeErrorHeaders(code, desc string) *Error {
	if code == "" {
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		return Errorf(CodeInternal, "reply with non-numeric error code %q: %s", code, desc)
	}
	return &Error{Code: Code(n), Msg: desc}
}

func describe(m proto.Message) string { return fmt.Sprint(m.ProtoReflect().Descriptor().FullName()) }
