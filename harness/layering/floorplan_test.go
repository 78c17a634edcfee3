package layering

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// side is what a folder of the floor plan is for.
type side string

const (
	// runtime is what a deployment runs: connexd, its router and the
	// packages they are built from.
	runtime side = "runtime"
	// engineSide runs beside or inside an inference engine and talks to its
	// connexd over the public subject API only.
	engineSide side = "engine"
	// harnessSide tests and measures the product from outside.
	harnessSide side = "harness"
	// binaries are the commands (cmd/): they may import anything.
	binaries side = "binaries"
	// ops is what builds, tests and watches the product without being Go
	// code of it (scripts, dashboards).
	ops side = "ops"
)

// floorPlan is ARCHITECTURE.md's floor plan: every top-level folder, and
// every folder of engine/ and harness/, with its side. A new folder gets a
// line here and in ARCHITECTURE.md's "Floor plan".
var floorPlan = map[string]side{
	"actors":        runtime,
	"advertise":     runtime,
	"api":           runtime,
	"auth":          runtime,
	"clock":         runtime,
	"cluster":       runtime,
	"clusterstatus": runtime,
	"config":        runtime,
	"daemon":        runtime,
	"errcode":       runtime,
	"kvmem":         runtime,
	"lease":         runtime,
	"messages":      runtime,
	"natsbus":       runtime,
	"natssubject":   runtime,
	"notices":       runtime,
	"pull":          runtime,
	"requests":      runtime,
	"router":        runtime,
	"transport":     runtime,

	"engine/shim":           engineSide,
	"engine/simengine":      engineSide,
	"engine/vllm-connector": engineSide, // Python: no Go package

	"harness/chaos":        harnessSide,
	"harness/e2e":          harnessSide,
	"harness/layering":     harnessSide,
	"harness/localcluster": harnessSide,
	"harness/netlab":       harnessSide,
	"harness/poll":         harnessSide,

	"cmd":     binaries,
	"deploy":  ops,
	"scripts": ops,
}

// testOnly are the harness packages a runtime or engine package's tests
// may import (its non-test code may import none).
var testOnly = []string{"harness/poll"}

// folderOf is the floor-plan folder of a module-relative package path:
// its first element, or its first two under engine/ and harness/.
func folderOf(name string) string {
	parts := strings.SplitN(name, "/", 3)
	if (parts[0] == "engine" || parts[0] == "harness") && len(parts) > 1 {
		return parts[0] + "/" + parts[1]
	}
	return parts[0]
}

// TestFloorPlanCoversTheTree fails for a Go package in a folder the floor
// plan does not name, a floor-plan folder that is gone, and a folder of
// engine/ or harness/ that has no line.
func TestFloorPlanCoversTheTree(t *testing.T) {
	for _, p := range listPackages(t) {
		name := strings.TrimPrefix(p.ImportPath, module)
		if _, ok := floorPlan[folderOf(name)]; !ok {
			t.Errorf("%s is in %s/, which the floor plan does not name (floorplan_test.go and ARCHITECTURE.md's Floor plan)", name, folderOf(name))
		}
	}
	for dir := range floorPlan {
		if fi, err := os.Stat(filepath.Join("..", "..", dir)); err != nil || !fi.IsDir() {
			t.Errorf("the floor plan names %s/, which is not a folder: %v", dir, err)
		}
	}
	for _, group := range []string{"engine", "harness"} {
		entries, err := os.ReadDir(filepath.Join("..", "..", group))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if _, ok := floorPlan[group+"/"+e.Name()]; e.IsDir() && !ok {
				t.Errorf("%s/%s/ has no line in the floor plan", group, e.Name())
			}
		}
	}
}

// TestSidesKeepTheirImports fails when the runtime imports the engine side
// or the harness, or the engine side imports the harness: the engine side
// talks to connexd through the subject API, and the harness tests the two
// from outside. Tests may import testOnly packages; binaries import anything.
func TestSidesKeepTheirImports(t *testing.T) {
	for _, p := range listPackages(t) {
		name := strings.TrimPrefix(p.ImportPath, module)
		from := floorPlan[folderOf(name)]
		if from == binaries || from == harnessSide {
			continue
		}
		check := func(imports []string, test bool) {
			for _, imp := range imports {
				dep, ok := strings.CutPrefix(imp, module)
				if !ok {
					continue
				}
				to := floorPlan[folderOf(dep)]
				switch {
				case to == harnessSide && test && slices.Contains(testOnly, dep):
				case to == harnessSide, to == engineSide && from == runtime:
					who := name
					if test {
						who = name + "'s tests"
					}
					t.Errorf("%s (%s) imports %s (%s): the floor plan does not allow it", who, from, dep, to)
				}
			}
		}
		check(p.Imports, false)
		check(slices.Concat(p.TestImports, p.XTestImports), true)
	}
}

// floorPlanLine is one line of ARCHITECTURE.md's floor-plan tree: the
// folder (indented under its parent) and what it holds.
var floorPlanLine = regexp.MustCompile(`^(\s*)([a-z0-9-]+)/\s+\S`)

// TestArchitectureShowsTheFloorPlan fails when ARCHITECTURE.md's "Floor
// plan" tree misses a folder of the floor plan or names one that does not
// exist, or its package table has no row for a package of the layering
// table.
func TestArchitectureShowsTheFloorPlan(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	shown := map[string]bool{} // folders of the floor-plan tree
	rows := map[string]bool{}  // folders of the package table's first column
	var section string
	var inTree bool
	var parents []string // the folder at each indent level (two spaces)
	cell := regexp.MustCompile("`([a-z0-9/._-]+)/`")
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			section = strings.TrimPrefix(line, "## ")
			continue
		}
		switch section {
		case "Floor plan":
			if strings.HasPrefix(line, "```") {
				inTree = !inTree
				continue
			}
			m := floorPlanLine.FindStringSubmatch(line)
			if !inTree || m == nil {
				continue
			}
			depth := len(m[1]) / 2
			if depth > len(parents) {
				t.Fatalf("ARCHITECTURE.md's floor plan: %q is indented deeper than its parent", line)
			}
			parents = append(parents[:depth], m[2])
			shown[strings.Join(parents, "/")] = true
		case "Packages":
			if cells := strings.Split(line, "|"); strings.HasPrefix(line, "| `") && len(cells) > 2 {
				for _, m := range cell.FindAllStringSubmatch(cells[1], -1) {
					rows[m[1]] = true
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(shown) < len(floorPlan) {
		t.Errorf("ARCHITECTURE.md's floor plan shows %d folders, fewer than the %d of the floor plan", len(shown), len(floorPlan))
	}
	for dir := range floorPlan {
		if !shown[dir] {
			t.Errorf("ARCHITECTURE.md's floor plan has no line for %s/", dir)
		}
	}
	for dir := range shown {
		if fi, err := os.Stat(filepath.Join("..", "..", dir)); err != nil || !fi.IsDir() {
			t.Errorf("ARCHITECTURE.md's floor plan shows %s/, which is not a folder", dir)
		}
	}
	for name := range rules {
		if !rows[name] {
			t.Errorf("ARCHITECTURE.md's package table has no row for %s/", name)
		}
	}
	for dir := range rows {
		if fi, err := os.Stat(filepath.Join("..", "..", dir)); err != nil || !fi.IsDir() {
			t.Errorf("ARCHITECTURE.md's package table has a row for %s/, which is not a folder", dir)
		}
	}
}
