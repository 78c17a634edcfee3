package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// processGroup lists the processes of group pgid (a `vllm serve`: its API
// server and its engine core), from /proc.
func processGroup(pgid int) []int {
	var out []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if g, err := unix.Getpgid(pid); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// pinProcess binds every thread of pid to cpu.
func pinProcess(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("threads of %d: %v", pid, err)
	}
	var errs []string
	for _, t := range tasks {
		tid, _ := strconv.Atoi(filepath.Base(t))
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			errs = append(errs, fmt.Sprintf("%d: %v", tid, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("pin %d to cpu %d: %s", pid, cpu, strings.Join(errs, "; "))
	}
	return nil
}

// cpuTime is the CPU time the threads of pids have run so far
// (/proc/<pid>/task/*/schedstat, nanoseconds; threads that exited are not
// counted).
func cpuTime(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) > 0 {
				ns, _ := strconv.ParseInt(f[0], 10, 64)
				total += time.Duration(ns)
			}
		}
	}
	return total
}

// threadCPU is the CPU time each thread of pids has run so far, by
// "process name/thread name" (their comm; threads of one name summed).
func threadCPU(pids []int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, pid := range pids {
		proc, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
		for _, t := range tasks {
			b, err := os.ReadFile(t + "/schedstat")
			comm, _ := os.ReadFile(t + "/comm")
			f := strings.Fields(string(b))
			if err != nil || len(f) == 0 {
				continue
			}
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			out[strings.TrimSpace(string(proc))+"/"+strings.TrimSpace(string(comm))] += time.Duration(ns)
		}
	}
	return out
}
