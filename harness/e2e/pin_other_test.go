//go:build !linux

package e2e

import (
	"errors"
	"time"
)

// processGroup is Linux-only (/proc); elsewhere BenchmarkVLLMPace cannot
// isolate an engine's CPU.
func processGroup(int) []int { return nil }

func pinProcess(int, int) error { return errors.New("pinning a process to a CPU needs Linux") }

func cpuTime([]int) time.Duration { return 0 }

func threadCPU([]int) map[string]time.Duration { return nil }
