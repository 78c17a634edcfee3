// Code generated from api/codes.json by `go generate ./api` (api/gencodes); DO NOT EDIT.

package shim

import "github.com/connex/connex/api"

// loadReasons names the load-failure codes that do not read as their
// name (Reason).
var loadReasons = map[api.Code]string{
	api.CodeUnknownTransfer: "unknown transfer",
	api.CodeBadLayout:       "incompatible",
	api.CodeEngineGone:      "holder unavailable",
	api.CodePeerUnavailable: "holder unavailable",
}
