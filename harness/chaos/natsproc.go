package chaos

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsConfEnv names the configuration a re-executed harness binary serves
// NATS with (ServeNATSIfAsked).
const natsConfEnv = "CONNEX_CHAOS_NATS_CONF"

// ServeNATSIfAsked makes this process a nats-server when the harness
// re-executed it for that (a NATS of its own, as a separate process the
// harness can kill and restart); it never returns then. Call it first in
// main (and in TestMain of tests that run the harness).
func ServeNATSIfAsked() {
	conf := os.Getenv(natsConfEnv)
	if conf == "" {
		return
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nats-server: %s: %v\n", conf, err)
		os.Exit(2)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nats-server: %v\n", err)
		os.Exit(2)
	}
	srv.ConfigureLogger()
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		fmt.Fprintln(os.Stderr, "nats-server: not ready within 20s")
		os.Exit(1)
	}
	fmt.Println("nats-server ready", srv.ClientURL())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	srv.Shutdown()
	srv.WaitForShutdown()
	os.Exit(0)
}

// natsProc is a NATS server in its own OS process, with JetStream and the
// authority of a Connex cluster, restartable on the same port and store.
type natsProc struct {
	conf, url, admin string
	cmd              *exec.Cmd
	exited           chan struct{}
}

// startNATSProc writes the configuration (listen on a free port, JetStream
// under dir, trust in the authority `connexd auth init` created in
// dir/auth) and starts the server.
func startNATSProc(ctx context.Context, connexd, dir string) (*natsProc, error) {
	authDir := filepath.Join(dir, "auth")
	trust, err := exec.CommandContext(ctx, connexd, "auth", "init", "--dir", authDir).Output()
	if err != nil {
		return nil, fmt.Errorf("chaos: connexd auth init: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	conf := filepath.Join(dir, "nats.conf")
	text := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q }\n%s", port, filepath.Join(dir, "jetstream"), trust)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	n := &natsProc{conf: conf, url: "nats://127.0.0.1:" + strconv.Itoa(port), admin: filepath.Join(authDir, "admin.creds")}
	return n, n.start(ctx)
}

func (n *natsProc) start(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), natsConfEnv+"="+n.conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start nats-server: %w", err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(n.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		nc, err := nats.Connect(n.url, nats.UserCredentials(n.admin), nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
			return nil
		}
		select {
		case <-n.exited:
			return fmt.Errorf("chaos: nats-server exited at start (%s)", n.conf)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: nats-server not ready within 20s: %w", err)
		}
	}
}

// kill SIGKILLs the server and waits for it.
func (n *natsProc) kill() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
}

// restart kills the server and starts it again on the same port and store.
func (n *natsProc) restart(ctx context.Context) error {
	n.kill()
	return n.start(ctx)
}

// close stops the server (SIGTERM, SIGKILL after 5 s).
func (n *natsProc) close() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(5 * time.Second):
		n.kill()
	}
}
