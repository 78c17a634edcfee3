package localcluster

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tailLines is how many output lines of each process are kept for errors.
const tailLines = 60

// process is one OS process of the cluster: a connexd or a connex-sim.
type process struct {
	name        string // "router", "decode-1/engine", …
	path        string
	args        []string
	readyPrefix string
	log         *lineLog

	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned
	ready  chan map[string]string

	started time.Time // when it was started (for RestartPolicy)

	mu       sync.Mutex
	tail     []string
	waitErr  error
	exitedAt time.Time
	fields   map[string]string
	intended bool     // an exit we asked for (Term, Close, Restart)
	notes    *lineLog // where the cluster's notes on it go (nil: log, with its output)
	stopped  bool     // SIGSTOPped and not continued since
}

// startProcess starts path with args; its stdout and stderr go to log,
// line by line, and the last lines are kept.
func startProcess(name, path string, args []string, readyPrefix string, log *lineLog) (*process, error) {
	return startProcessAs(name, path, args, readyPrefix, log, childEnv(), nil)
}

// startProcessEnv is startProcess with the child's environment. An empty
// readyPrefix means the caller learns readiness another way (e.g. HTTP).
func startProcessEnv(name, path string, args []string, readyPrefix string, log *lineLog, env []string) (*process, error) {
	return startProcessAs(name, path, args, readyPrefix, log, env, nil)
}

// startProcessAs is startProcessEnv run as user (nil: the launcher's own).
func startProcessAs(name, path string, args []string, readyPrefix string, log *lineLog, env []string, user *User) (*process, error) {
	p := &process{
		name: name, path: path, args: args, readyPrefix: readyPrefix, log: log,
		exited: make(chan struct{}), ready: make(chan map[string]string, 1),
	}
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout = &lineWriter{line: p.stdoutLine}
	cmd.Stderr = &lineWriter{line: p.outputLine}
	cmd.SysProcAttr = sysProcAttr()
	if user != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: user.UID, Gid: user.GID}
	}
	// Output copying stops this long after the process exits, even if
	// something it started still holds the pipes.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: start %s (%s): %w", name, path, err)
	}
	p.cmd, p.started = cmd, time.Now()
	go p.wait()
	return p, nil
}

func (p *process) wait() {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.waitErr, p.exitedAt = err, time.Now()
	intended, notes := p.intended, cmp.Or(p.notes, p.log)
	p.mu.Unlock()
	if !intended { // before exited closes, so no note outlives Close
		state := "exited"
		if err != nil {
			state += ": " + err.Error()
		}
		notes.note("localcluster: %s (pid %d) %s", p.name, p.pid(), state)
	}
	close(p.exited)
}

// exit says, once exited is closed, whether the exit was asked for, why the
// process exited ("signal: killed", "exit status 1", "exited") and how long
// it ran.
func (p *process) exit() (intended bool, why string, ran time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	why = "exited"
	if p.waitErr != nil {
		why = p.waitErr.Error()
	}
	return p.intended, why, p.exitedAt.Sub(p.started)
}

func (p *process) stdoutLine(line string) {
	if fields, ok := parseReady(line, p.readyPrefix); ok && p.readyPrefix != "" {
		p.mu.Lock()
		first := p.fields == nil
		if first {
			p.fields = fields
		}
		p.mu.Unlock()
		if first {
			p.ready <- fields
		}
	}
	p.outputLine(line)
}

func (p *process) outputLine(line string) {
	p.mu.Lock()
	p.tail = append(p.tail, line)
	if len(p.tail) > tailLines {
		p.tail = p.tail[len(p.tail)-tailLines:]
	}
	p.mu.Unlock()
	p.log.line(p.name, line)
}

// logs is the process's last output lines.
func (p *process) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *process) setStopped(v bool) {
	p.mu.Lock()
	p.stopped = v
	p.mu.Unlock()
}

// live reports whether the process runs and is not stopped.
func (p *process) live() bool {
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	return !stopped && p.running()
}

// waitReady waits for the ready line and returns its fields.
func (p *process) waitReady(ctx context.Context, timeout time.Duration) (map[string]string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case f := <-p.ready:
		return f, nil
	case <-p.exited:
		p.mu.Lock()
		err := p.waitErr
		p.mu.Unlock()
		return nil, fmt.Errorf("localcluster: %s exited before its ready line (%v); last output:\n%s", p.name, err, p.logs())
	case <-t.C:
		return nil, fmt.Errorf("localcluster: %s printed no ready line within %s; last output:\n%s", p.name, timeout, p.logs())
	case <-ctx.Done():
		return nil, fmt.Errorf("localcluster: %s not ready: %w", p.name, ctx.Err())
	}
}

// signal sends s unless the process has exited.
func (p *process) signal(s syscall.Signal) error {
	if !p.running() {
		return fmt.Errorf("localcluster: %s (pid %d) is not running", p.name, p.pid())
	}
	if err := p.signalGroup(s); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("localcluster: signal %s to %s: %w", s, p.name, err)
	}
	return nil
}

// term stops the process: SIGCONT (in case it is stopped), SIGTERM, and
// SIGKILL if it has not exited within grace. It returns an error only when
// SIGKILL was needed.
func (p *process) term(grace time.Duration) error {
	p.mu.Lock()
	p.intended = true
	p.mu.Unlock()
	if !p.running() {
		return nil
	}
	_ = p.signalGroup(syscall.SIGCONT)
	p.setStopped(false)
	_ = p.signalGroup(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		_ = p.signalGroup(syscall.SIGKILL) // what the leader left behind (vLLM's engine core)
		return nil
	case <-t.C:
	}
	_ = p.signalGroup(syscall.SIGKILL)
	<-p.exited
	return fmt.Errorf("localcluster: %s (pid %d) did not exit within %s of SIGTERM and was killed; last output:\n%s",
		p.name, p.pid(), grace, p.logs())
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	_ = p.signalGroup(syscall.SIGKILL)
	<-p.exited
}

// signalGroup sends s to the process's whole group (each child leads its
// own: Setpgid): a `vllm serve` is an API server and an engine-core child,
// and killing an engine means both. After the leader exited, the group's
// remaining members still get s; with none left it is a no-op.
func (p *process) signalGroup(s syscall.Signal) error {
	err := syscall.Kill(-p.pid(), s)
	if errors.Is(err, syscall.ESRCH) {
		if p.running() {
			return p.cmd.Process.Signal(s)
		}
		return os.ErrProcessDone
	}
	return err
}

// lineWriter calls line for each complete line written to it; a last line
// without a newline is dropped (the binaries end every line).
type lineWriter struct {
	buf  []byte
	line func(string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(strings.TrimRight(string(w.buf[:i]), "\r"))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 { // a runaway line: pass it on in pieces
		w.line(string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(b), nil
}

// lineLog writes the processes' lines and the cluster's notes to one
// writer, one whole line at a time.
type lineLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineLog) line(name, text string) {
	if l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "%-16s | %s\n", name, text)
}

func (l *lineLog) note(format string, args ...any) {
	if l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}
