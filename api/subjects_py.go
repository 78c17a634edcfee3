package api

import (
	"bytes"
	"fmt"
	"slices"
)

// Endpoints lists every endpoint of the subject API, as Serve registers
// them.
var Endpoints = []string{
	EpRegionRegister, EpRegionCreate, EpRegionInspect, EpEngineGone, EpEngineRegister, EpEngineNotices,
	EpEngineState, EpMemberStatus, EpHoldCreate, EpHoldRenew, EpHoldRelease, EpHoldInspect, EpPullStart,
	EpPeerDescriptors, EpPeerPullEnd, EpRequestStart, EpRequestProgress, EpRequestFinish, EpRequestInspect,
	EpPeerAdopt, EpPeerGrant,
}

// NoticeKinds lists every notice kind connexd publishes to engines.
var NoticeKinds = []string{KindPullDone, KindFreed, KindResume, KindFenced, KindHoldLost}

// PythonSubjectsPath is where PythonSubjects is written, from the
// repository's root.
const PythonSubjectsPath = "engine/vllm-connector/connex_vllm/subjects_gen.py"

// PythonSubjects is the vLLM connector's copy of the subject table
// (connex_vllm/subjects_gen.py): the prefix, every endpoint, those served
// only in the member scope (EngineScoped false), so that the connector
// never addresses an endpoint in a scope connexd does not serve it in, and
// the notice kinds (NoticeKinds), so that it never waits for a kind
// connexd does not send. `go generate ./api` writes it; TestPythonSubjectsAreCurrent
// fails when it drifts.
func PythonSubjects() []byte {
	var b bytes.Buffer
	b.WriteString("# Code generated from api/subjects.go by `go generate ./api` (api/gencodes); DO NOT EDIT.\n")
	b.WriteString(`"""The subject API's table as connexd serves it: its prefix, every endpoint, the endpoints served only in the
member scope (members and admins call them; every other endpoint is also served in each engine's scope), and the
kinds of notice connexd publishes to engines."""` + "\n\n")
	b.WriteString("from __future__ import annotations\n\nfrom typing import Final\n\n")
	fmt.Fprintf(&b, "PREFIX: Final = %q\n\n", Prefix)
	b.WriteString("ENDPOINTS: Final = frozenset(\n    {\n")
	eps := slices.Sorted(slices.Values(Endpoints))
	for _, ep := range eps {
		fmt.Fprintf(&b, "        %q,\n", ep)
	}
	b.WriteString("    }\n)\n\n")
	b.WriteString("MEMBER_ONLY: Final = frozenset(\n    {\n")
	for _, ep := range eps {
		if !EngineScoped(ep) {
			fmt.Fprintf(&b, "        %q,\n", ep)
		}
	}
	b.WriteString("    }\n)\n\n")
	b.WriteString("NOTICE_KINDS: Final = frozenset(\n    {\n")
	for _, k := range slices.Sorted(slices.Values(NoticeKinds)) {
		fmt.Fprintf(&b, "        %q,\n", k)
	}
	b.WriteString("    }\n)\n")
	return b.Bytes()
}
