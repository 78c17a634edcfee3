package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var (
	binDir   string // connexd and connex-sim, as `make build` makes them
	plantDir string // the same, connexd built with -tags chaosplant
)

func TestMain(m *testing.M) {
	ServeNATSIfAsked()
	BurnIfAsked()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "connex-chaos-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir, plantDir = filepath.Join(dir, "bin"), filepath.Join(dir, "plant")
	tags := buildTags()
	for _, b := range []struct{ out, pkg, tags string }{
		{filepath.Join(binDir, "connexd"), "./cmd/connexd", tags},
		{filepath.Join(binDir, "connex-sim"), "./cmd/connex-sim", tags},
		{filepath.Join(plantDir, "connexd"), "./cmd/connexd", strings.TrimPrefix(tags+",chaosplant", ",")},
		{filepath.Join(plantDir, "connex-sim"), "./cmd/connex-sim", tags},
	} {
		cmd := exec.Command("go", "build", "-tags", b.tags, "-o", b.out, b.pkg)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", b.pkg, err, out)
			return 1
		}
	}
	return m.Run()
}

func loadScenario(t *testing.T, path string) *Scenario {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ParseScenario(data)
	if err != nil {
		t.Fatal(err)
	}
	sc.Name = filepath.Base(path)
	return sc
}

// testLog is where the processes' output goes: discarded unless
// CONNEX_TEST_LOG is set.
func testOptions(dir string) Options {
	o := Options{Connexd: filepath.Join(dir, "connexd")}
	if os.Getenv("CONNEX_TEST_LOG") != "" {
		o.Log = os.Stderr
	}
	return o
}

// runScenario runs sc the way connex-chaos does and returns its report
// and its table (logged).
func runScenario(t *testing.T, sc *Scenario) (*Report, string) {
	t.Helper()
	rep, err := Run(context.Background(), sc, testOptions(binDir))
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
	return rep, table.String()
}

// TestQuickScenarioPasses runs the CI scenario (make chaos) the way
// connex-chaos does, with its report and picture, and checks that every
// invariant held and the outputs are readable.
func TestQuickScenarioPasses(t *testing.T) {
	sc := loadScenario(t, "scenarios/quick.yaml")
	rep, table := runScenario(t, sc)
	if !rep.OK() {
		t.Fatalf("the quick scenario broke an invariant:\n%s", table)
	}
	if rep.Requests != sc.Load.Requests || rep.Completed+rep.Failed != rep.Requests || len(rep.Faults) != len(sc.Faults) {
		t.Fatalf("report counts: %+v, %d faults", rep.Summary, len(rep.Faults))
	}
	dir := t.TempDir()
	if err := rep.WriteJSON(filepath.Join(dir, "r.json")); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	data, _ := os.ReadFile(filepath.Join(dir, "r.json"))
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"requests", "completed", "failed", "lost", "resumed", "prefills", "diverged", "leaked_blocks", "double_frees", "failover_ms_p50", "failover_ms_p99", "faults"} {
		if _, ok := back[k]; !ok {
			t.Errorf("the JSON report lacks %q", k)
		}
	}
	if err := rep.WritePlot(filepath.Join(dir, "r.png")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "r.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil || img.Bounds().Dx() < 1000 {
		t.Fatalf("the picture: %v %v", img.Bounds(), err)
	}
}

// TestMixedShapesScenarioPasses runs scenarios/mixed-shapes.yaml: engines
// of five KV shapes (TP 1, 2 and 4; blocks of 8, 16 and 32 tokens; NHD,
// HND and the CPU order), decode nodes killed mid-stream. Every invariant
// holds (0 lost, no second prefill, 0 diverged from the reference, no
// leaked block, exactly-once free), requests resumed, and every request was
// prefilled once.
func TestMixedShapesScenarioPasses(t *testing.T) {
	rep, table := runScenario(t, loadScenario(t, "scenarios/mixed-shapes.yaml"))
	if !rep.OK() || rep.Lost != 0 || rep.Diverged != 0 {
		t.Fatalf("the mixed-shapes scenario broke an invariant:\n%s", table)
	}
	if rep.Resumed == 0 {
		t.Fatalf("no request resumed: the faults missed the streams, nothing crossed shapes on a resume\n%s", table)
	}
	if rep.Prefills != rep.Requests || rep.Completed != rep.Requests {
		t.Fatalf("%d prefills and %d completed for %d requests, want one prefill each and all complete\n%s", rep.Prefills, rep.Completed, rep.Requests, table)
	}
}

// plantScenario makes streams long enough to be mid-flight when a decode
// node dies, so that requests resume.
const plantScenario = `
seed: 5
timeout: 3m
nodes: {prefill: 1, decode: 2}
engine: {prefill_us_per_token: 50, decode_ms_per_token: 10}
load: {requests: 12, concurrency: 4, prompt_tokens: 64, max_tokens: 150, stream: 1}
retain_s: 5
faults:
  - {at: 700ms, action: kill, target: decode-0}
  - {at: 1500ms, action: restart, target: decode-0}
  - {at: 2300ms, action: kill, target: decode-1}
  - {at: 3100ms, action: restart, target: decode-1}
`

// TestPlantedBugsAreCaught plants each bug the harness exists to catch and
// checks that the run fails on the invariant it breaks, naming requests.
func TestPlantedBugsAreCaught(t *testing.T) {
	for _, c := range []struct {
		name  string
		plant string   // CONNEX_PLANT of a connexd built with -tags chaosplant
		args  []string // extra connexd flags
		inv   string
	}{
		// Blocks freed on the first pull instead of on release: a resumed
		// request finds its hold gone and is prefilled again.
		{name: "free-on-pull", args: []string{"--release", "after_pull"}, inv: InvNoSecondPrefill},
		{name: "drop-token-on-resume", plant: "drop-token-on-resume", inv: InvSameAnswer},
		{name: "second-prefill-on-resume", plant: "second-prefill-on-resume", inv: InvNoSecondPrefill},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("CONNEX_PLANT", c.plant)
			sc, err := ParseScenario([]byte(plantScenario))
			if err != nil {
				t.Fatal(err)
			}
			sc.Name = "plant-" + c.name
			o := testOptions(plantDir)
			o.ConnexdArgs = c.args
			rep, err := Run(context.Background(), sc, o)
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			rep.WriteTable(&table)
			if rep.Resumed+rep.Failed == 0 {
				t.Fatalf("no request was interrupted, so the plant was never exercised:\n%s", table.String())
			}
			var hit *Violation
			for i, v := range rep.Violations {
				if v.Invariant == c.inv {
					hit = &rep.Violations[i]
				}
			}
			if hit == nil || len(hit.Requests) == 0 {
				t.Fatalf("planted %s: want a %q violation naming requests, got:\n%s", c.name, c.inv, table.String())
			}
			t.Logf("caught: %s", hit)
		})
	}
}
