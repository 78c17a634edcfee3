//go:build ucx

package chaos

func buildTags() string { return "ucx" }
