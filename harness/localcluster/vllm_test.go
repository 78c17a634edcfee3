package localcluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestThreadsBind(t *testing.T) {
	for _, tc := range []struct {
		i, tp, cpus int
		want        string
	}{
		{0, 1, 2, "0"}, {1, 1, 2, "1"}, {2, 1, 2, "0"},
		{0, 2, 2, "0|1"}, {1, 2, 2, "1|0"}, {3, 4, 8, "3|4|5|6"}, {1, 2, 1, "0|0"},
	} {
		if got := threadsBind(tc.i, tc.tp, tc.cpus); got != tc.want {
			t.Errorf("threadsBind(%d, %d, %d) = %q, want %q", tc.i, tc.tp, tc.cpus, got, tc.want)
		}
	}
}

func TestVLLMTensorParallelArgs(t *testing.T) {
	model := t.TempDir()
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := (&VLLM{Bin: "vllm", Model: model, PrefillTP: 4, TPFor: map[string]int{"decode-1": 2}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	tp := v.serveArgs("decode-1", RoleDecode, "m", 1, "{}")
	if i := slices.Index(tp, "--tensor-parallel-size"); i < 0 || tp[i+1] != "2" {
		t.Errorf("decode-1 (TP 2) args %v lack --tensor-parallel-size 2", tp)
	}
	if one := v.serveArgs("decode-0", RoleDecode, "m", 1, "{}"); slices.Contains(one, "--tensor-parallel-size") {
		t.Errorf("decode-0 (TP 1) args %v name a tensor-parallel size", one)
	}
	if p := v.serveArgs("prefill-3", RolePrefill, "m", 1, "{}"); !slices.Contains(p, "4") {
		t.Errorf("prefill-3 (PrefillTP 4) args %v", p)
	}
	if e := strings.Join(v.env(1, 2), " "); !strings.Contains(e, "VLLM_CPU_OMP_THREADS_BIND=") {
		t.Errorf("env %s binds no threads", e)
	}
	for _, bad := range []int{-1, 65} {
		if _, err := (&VLLM{Bin: "vllm", Model: model, TPFor: map[string]int{"x": bad}}).withDefaults(); err == nil {
			t.Errorf("TPFor %d accepted", bad)
		}
		if _, err := (&VLLM{Bin: "vllm", Model: model, DecodeTP: bad}).withDefaults(); err == nil {
			t.Errorf("DecodeTP %d accepted", bad)
		}
	}
}
