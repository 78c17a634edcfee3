package localcluster

import (
	"fmt"
	"strconv"
	"strings"
)

// Role is an engine's role.
type Role string

// Engine roles.
const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// RouterName is the router's name and member id.
const RouterName = "router"

// Part is one process of an engine pair.
type Part string

// Parts of a target.
const (
	// PartBoth names the engine and its connexd (a bare engine name).
	PartBoth Part = ""
	// PartEngine names the connex-sim process.
	PartEngine Part = "engine"
	// PartConnexd names the connexd process (the only part of the router).
	PartConnexd Part = "connexd"
)

// Target is a parsed target: a node name and which of its processes.
type Target struct {
	Name string // "router", "prefill-0", "decode-1", …
	Part Part
}

// String is the target as ParseTarget reads it.
func (t Target) String() string {
	if t.Part == PartBoth {
		return t.Name
	}
	return t.Name + "/" + string(t.Part)
}

// ParseTarget reads "router", "<role>-<i>", "<role>-<i>/engine" or
// "<role>-<i>/connexd" ("router/connexd" is the router too).
func ParseTarget(s string) (Target, error) {
	name, part, hasPart := strings.Cut(s, "/")
	t := Target{Name: name, Part: Part(part)}
	if hasPart && t.Part != PartEngine && t.Part != PartConnexd {
		return Target{}, fmt.Errorf("localcluster: target %q: part must be %q or %q", s, PartEngine, PartConnexd)
	}
	if name == RouterName {
		if t.Part == PartEngine {
			return Target{}, fmt.Errorf("localcluster: target %q: the router has no engine", s)
		}
		return Target{Name: RouterName, Part: PartConnexd}, nil
	}
	if _, _, err := parseEngineName(name); err != nil {
		return Target{}, fmt.Errorf("localcluster: target %q: %w", s, err)
	}
	return t, nil
}

// parseEngineName splits "decode-1" into its role and index.
func parseEngineName(name string) (Role, int, error) {
	role, idx, ok := strings.Cut(name, "-")
	if !ok || (Role(role) != RolePrefill && Role(role) != RoleDecode) {
		return "", 0, fmt.Errorf("name %q is not %q, prefill-<i> or decode-<i>", name, RouterName)
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || strconv.Itoa(i) != idx {
		return "", 0, fmt.Errorf("name %q: index %q is not a non-negative integer", name, idx)
	}
	return Role(role), i, nil
}

// engineName is the name of the i-th engine of role.
func engineName(role Role, i int) string { return fmt.Sprintf("%s-%d", role, i) }

// processName is the name a process's log lines and PIDs use.
func processName(name string, part Part) string {
	if name == RouterName {
		return RouterName
	}
	return name + "/" + string(part)
}
