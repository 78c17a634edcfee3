package localcluster

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// clientEnvKeys are the variables ClientEnv sets, in the order it sets
// them. CONNEX_NATS_URL and CONNEX_NATS_CREDS are what `connexd status`
// reads (and, as nats_url and nats_creds, connexd's config); NATS_URL and
// NATS_CREDS are the nats CLI's own; the last two are for curl.
var clientEnvKeys = []string{
	"CONNEX_NATS_URL", "CONNEX_NATS_CREDS", "NATS_URL", "NATS_CREDS", "CONNEX_ROUTER_URL", "CONNEX_ADMIN_KEY_FILE",
}

// ClientEnv is what a client in a shell needs to reach the cluster, as
// name=value pairs in a fixed order: CONNEX_NATS_URL and CONNEX_NATS_CREDS
// (`connexd status` reads them), NATS_URL and NATS_CREDS (the nats CLI
// reads them), CONNEX_ROUTER_URL and CONNEX_ADMIN_KEY_FILE (the router's
// base URL and the file of the key its /connex/v1/* and /metrics take).
// A credentials variable is left out when the bus has no authentication.
func (c *Cluster) ClientEnv() []string {
	natsURL, routerURL, creds := c.NATSURL(), c.RouterURL(), c.AdminCreds()
	vals := map[string]string{
		"CONNEX_NATS_URL": natsURL, "CONNEX_NATS_CREDS": creds, "NATS_URL": natsURL, "NATS_CREDS": creds,
		"CONNEX_ROUTER_URL": routerURL, "CONNEX_ADMIN_KEY_FILE": c.AdminKeyFile(),
	}
	var out []string
	for _, k := range clientEnvKeys {
		if v := vals[k]; v != "" {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// WriteClientEnv writes ClientEnv to path as a file a POSIX shell sources
// (`. path`), one `export NAME='value'` a line, replacing it atomically.
func (c *Cluster) WriteClientEnv(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# The local Connex cluster in %s (connex-up, pid %d): `. %s` points this shell at it.\n", c.dir, os.Getpid(), path)
	for _, kv := range c.ClientEnv() {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	return writeFileAtomic(path, []byte(b.String()), 0o600)
}

// childEnv is the launcher's environment less the variables ClientEnv sets:
// a shell that sourced an earlier cluster's file must not point this
// cluster's processes at that one (a router's connexd would read
// CONNEX_NATS_URL as its nats_url instead of embedding its own server).
// Everything the processes need of that kind is passed as flags.
func childEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(clientEnvKeys, k)
	})
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
