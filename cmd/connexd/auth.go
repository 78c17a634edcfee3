package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/connex/connex/auth"
	"github.com/spf13/pflag"
)

const authUsage = `usage: connexd auth <command> [--dir DIR] ...

  init           create the authority in DIR (if missing), write DIR/admin.creds,
                 print the nats-server configuration that trusts it
  server-config  print the nats-server configuration that trusts DIR's authority
  creds          mint a credentials file: --role member --member M
                                          --role engine --member M --engine E
                                          [--engine-role prefill|decode] [--model NAME]
                                          --role admin
                 (-o FILE writes it 0600; without -o it goes to stdout)

DIR defaults to $CONNEX_AUTH_DIR, else connex-data/auth (where a connexd with the
default data_dir and the embedded NATS server keeps its authority).
`

// runAuth is `connexd auth`: the authority and credentials of the bus.
func runAuth(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stderr, authUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd := args[0]
	fs := pflag.NewFlagSet("connexd auth "+cmd, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", envOr("CONNEX_AUTH_DIR", filepath.Join("connex-data", "auth")), "authority directory")
	role := fs.String("role", "", "creds: member, engine or admin")
	member := fs.String("member", "", "creds: the member id (member and engine roles)")
	engine := fs.String("engine", "", "creds: the engine id (engine role)")
	engineRole := fs.String("engine-role", "", "creds: the role the engine may register, prefill or decode (engine role; empty: any)")
	model := fs.String("model", "", "creds: the model the engine may register (engine role; empty: any)")
	ttl := fs.Duration("ttl", 0, "creds: expire after this long (0: never)")
	out := fs.StringP("out", "o", "", "creds: write to this file (0600) instead of stdout")
	fs.Usage = func() { fmt.Fprint(stderr, authUsage); fs.PrintDefaults() }
	if err := fs.Parse(args[1:]); err != nil {
		if err == pflag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "connexd auth %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "connexd auth %s: %v\n", cmd, err)
		return 1
	}
	switch cmd {
	case "init", "server-config":
		a, err := auth.Open(*dir, cmd == "init")
		if err != nil {
			return fail(err)
		}
		if cmd == "init" {
			admin := filepath.Join(*dir, auth.AdminCredsFile)
			if err := a.WriteCreds(admin, auth.Identity{Role: auth.RoleAdmin}, 0); err != nil {
				return fail(err)
			}
			fmt.Fprintf(stderr, "authority in %s; admin credentials in %s\n", *dir, admin)
		}
		conf, err := a.ServerConfig()
		if err != nil {
			return fail(err)
		}
		fmt.Fprint(stdout, conf)
		return 0
	case "creds":
		a, err := auth.Open(*dir, false)
		if err != nil {
			return fail(err)
		}
		id := auth.Identity{Role: *role, Member: *member, Engine: *engine, EngineRole: *engineRole, Model: *model}
		if err := id.Validate(); err != nil {
			fmt.Fprintf(stderr, "connexd auth creds: %v\n", err)
			return 2
		}
		if *out != "" {
			if err := a.WriteCreds(*out, id, *ttl); err != nil {
				return fail(err)
			}
			return 0
		}
		creds, err := a.Creds(id, *ttl)
		if err != nil {
			return fail(err)
		}
		_, err = stdout.Write(creds)
		if err != nil {
			return fail(err)
		}
		return 0
	}
	fmt.Fprintf(stderr, "connexd auth: unknown command %q\n\n%s", cmd, authUsage)
	return 2
}

// credsDefault is where `connexd status` looks for credentials when
// neither --creds nor CONNEX_NATS_CREDS names them: the admin credentials
// of a connexd with the default data_dir, if they exist.
var credsDefault = filepath.Join("connex-data", "auth", auth.AdminCredsFile)
