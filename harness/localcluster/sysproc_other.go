//go:build unix && !linux

package localcluster

import "syscall"

// sysProcAttr puts each child in its own process group; without Linux's
// parent-death signal, children outlive a launcher that is SIGKILLed.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
