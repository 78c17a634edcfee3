package localcluster

import "syscall"

// sysProcAttr puts each child in its own process group (a terminal's Ctrl-C
// reaches only the launcher, which stops the children in order) and has the
// kernel SIGKILL it when the launcher dies, even by SIGKILL. Pdeathsig fires
// when the thread that started the child exits; the Go runtime does not end
// threads that no goroutine locked, so in practice that is the process.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
