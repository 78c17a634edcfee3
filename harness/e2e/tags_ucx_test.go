//go:build ucx

package e2e

func buildTags() string { return "ucx" }
