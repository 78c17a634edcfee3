package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// burnEnv marks a re-executed harness binary as a CPU burner (BurnIfAsked).
const burnEnv = "CONNEX_CHAOS_BURN"

// BurnIfAsked makes this process spin one core forever when the harness
// re-executed it as a CPU burner (a scenario's burn.procs); it never
// returns then. Call it first in main (and in TestMain of tests that run
// the harness), beside ServeNATSIfAsked.
func BurnIfAsked() {
	if os.Getenv(burnEnv) == "" {
		return
	}
	// One goroutine on one thread: a single runnable task for the kernel
	// to share the cores with, exactly like a busy neighbour process.
	var x uint64
	for {
		x = x*6364136223846793005 + 1442695040888963407
		if x == 0 {
			fmt.Fprintln(os.Stderr, "unreachable")
		}
	}
}

// burners are the CPU burner processes of one run.
type burners struct{ cmds []*exec.Cmd }

// startBurners starts n burners at the harness's own priority. They die
// with the harness (parent-death signal) if it is killed before stop.
func startBurners(n int) (*burners, error) {
	b := &burners{}
	if n == 0 {
		return b, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	for range n {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), burnEnv+"=1", "GOMAXPROCS=1", "GOGC=off")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			b.stop()
			return nil, fmt.Errorf("chaos: start CPU burner: %w", err)
		}
		b.cmds = append(b.cmds, cmd)
	}
	return b, nil
}

// stop kills every burner and waits for it; safe to call twice.
func (b *burners) stop() {
	if b == nil {
		return
	}
	for _, c := range b.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	b.cmds = nil
}
