//go:build chaosplant

package router

import (
	"os"
	"slices"
	"strings"
)

// planted reports whether CONNEX_PLANT (comma-separated) names bug: the
// chaos harness's tests build connexd with -tags chaosplant and plant
// "second-prefill-on-resume" or "drop-token-on-resume" to show that the
// harness catches them. Never in a product build.
func planted(bug string) bool {
	return slices.Contains(strings.Split(os.Getenv("CONNEX_PLANT"), ","), bug)
}
