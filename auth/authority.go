package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// AccountName and SystemAccountName name the two accounts an Authority
// signs: every Connex identity lives in the first; the second is NATS's own
// (server events, `nats server` commands with system credentials).
const (
	AccountName       = "CONNEX"
	SystemAccountName = "SYS"
)

// Files of an Authority's directory.
const (
	operatorFile = "operator.nk"
	accountFile  = "account.nk"
	systemFile   = "system.nk"
	// AdminCredsFile is where an embedded server's connexd writes the admin
	// credentials (`connexd status`, the `nats` CLI: --creds).
	AdminCredsFile = "admin.creds"
)

// ErrNoAuthority means the directory holds no authority keys (run
// `connexd auth init`, or start a connexd with the embedded server there).
var ErrNoAuthority = errors.New("auth: no authority keys")

// Authority holds the operator, account and system-account keys that every
// Connex identity's JWT chains up to. Anyone who can read its directory can
// mint any identity: keep it on the host of the embedded server or of the
// operator's tooling, 0700.
type Authority struct {
	Dir      string
	operator nkeys.KeyPair
	account  nkeys.KeyPair
	system   nkeys.KeyPair
}

// Open loads the authority in dir. With create, a missing authority is
// generated (the directory 0700, each seed 0600); an existing one is never
// replaced, so credentials minted earlier stay valid across restarts.
func Open(dir string, create bool) (*Authority, error) {
	if dir == "" {
		return nil, errors.New("auth: no authority directory given")
	}
	a := &Authority{Dir: dir}
	var err error
	if a.operator, err = loadSeed(dir, operatorFile, nkeys.PrefixByteOperator, create); err != nil {
		return nil, err
	}
	if a.account, err = loadSeed(dir, accountFile, nkeys.PrefixByteAccount, create); err != nil {
		return nil, err
	}
	if a.system, err = loadSeed(dir, systemFile, nkeys.PrefixByteAccount, create); err != nil {
		return nil, err
	}
	return a, nil
}

func loadSeed(dir, name string, prefix nkeys.PrefixByte, create bool) (nkeys.KeyPair, error) {
	path := filepath.Join(dir, name)
	data, err := os.ReadFile(path)
	if err == nil {
		kp, err := nkeys.FromSeed(bytesTrim(data))
		if err != nil {
			return nil, fmt.Errorf("auth: %s: not an nkey seed: %w", path, err)
		}
		if seed, _ := kp.Seed(); len(seed) < 2 || !isPrefix(seed, prefix) {
			return nil, fmt.Errorf("auth: %s: seed of the wrong kind (want %s)", path, prefix)
		}
		return kp, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("auth: read %s: %w", path, err)
	}
	if !create {
		return nil, fmt.Errorf("%w in %s (%s missing)", ErrNoAuthority, dir, name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth: create %s: %w", dir, err)
	}
	kp, err := nkeys.CreatePair(prefix)
	if err != nil {
		return nil, fmt.Errorf("auth: generate %s key: %w", prefix, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	if err := writeSecret(path, append(seed, '\n')); err != nil {
		return nil, err
	}
	return kp, nil
}

func isPrefix(seed []byte, prefix nkeys.PrefixByte) bool {
	p, _, err := nkeys.DecodeSeed(seed)
	return err == nil && p == prefix
}

func bytesTrim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// writeSecret writes data to path, 0600, atomically (a reader sees the old
// file or the whole new one).
func writeSecret(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	return nil
}

func publicKey(kp nkeys.KeyPair) string {
	pub, err := kp.PublicKey()
	if err != nil { // a key pair made from a valid seed always has one
		panic("auth: key pair without a public key: " + err.Error())
	}
	return pub
}

// OperatorPublicKey is the operator's public key, as a server
// configuration's "operator" names it.
func (a *Authority) OperatorPublicKey() string { return publicKey(a.operator) }

// AccountPublicKey is the public key of the account connexd and the shims
// use, as a server configuration's resolver preload names it.
func (a *Authority) AccountPublicKey() string { return publicKey(a.account) }

// SystemAccountPublicKey is the system account's public key, as a server
// configuration's "system_account" names it.
func (a *Authority) SystemAccountPublicKey() string { return publicKey(a.system) }

// OperatorJWT is the operator claim a server trusts (operator: in its
// configuration, TrustedOperators when embedded).
func (a *Authority) OperatorJWT() (string, *jwt.OperatorClaims, error) {
	oc := jwt.NewOperatorClaims(a.OperatorPublicKey())
	oc.Name = "connex"
	oc.SystemAccount = a.SystemAccountPublicKey()
	tok, err := oc.Encode(a.operator)
	if err != nil {
		return "", nil, fmt.Errorf("auth: sign operator: %w", err)
	}
	return tok, oc, nil
}

// AccountJWTs are the account claims a server resolves, by public key:
// the Connex account (JetStream without account limits: the server's own
// limits and connexd's quotas bound it) and the system account.
func (a *Authority) AccountJWTs() (map[string]string, error) {
	ac := jwt.NewAccountClaims(a.AccountPublicKey())
	ac.Name = AccountName
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	acc, err := ac.Encode(a.operator)
	if err != nil {
		return nil, fmt.Errorf("auth: sign account: %w", err)
	}
	sc := jwt.NewAccountClaims(a.SystemAccountPublicKey())
	sc.Name = SystemAccountName
	sys, err := sc.Encode(a.operator)
	if err != nil {
		return nil, fmt.Errorf("auth: sign system account: %w", err)
	}
	return map[string]string{a.AccountPublicKey(): acc, a.SystemAccountPublicKey(): sys}, nil
}

// Creds mints a credentials file (a user JWT and its seed, the format
// `nats --creds`, nats.UserCredentials and nats-py's user_credentials
// read) for id, with id's permissions; ttl > 0 makes it expire.
func (a *Authority) Creds(id Identity, ttl time.Duration) ([]byte, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("auth: generate user key: %w", err)
	}
	uc := jwt.NewUserClaims(publicKey(user))
	uc.Name = id.Name()
	uc.Permissions = id.Permissions()
	uc.Tags.Add("connex-role:" + id.Role)
	if id.Role == RoleEngine {
		uc.Tags.Add(id.engineTags()...)
		uc.Limits.NatsLimits = EngineLimits
	}
	if ttl > 0 {
		uc.Expires = time.Now().Add(ttl).Unix()
	}
	tok, err := uc.Encode(a.account)
	if err != nil {
		return nil, fmt.Errorf("auth: sign %s: %w", id.Name(), err)
	}
	seed, err := user.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(tok, seed)
}

// SystemCreds mints credentials of the system account's user (for `nats
// server` commands); they can see every connection, so keep them as close
// as the authority itself.
func (a *Authority) SystemCreds() ([]byte, error) {
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("auth: generate user key: %w", err)
	}
	uc := jwt.NewUserClaims(publicKey(user))
	uc.Name = "system"
	tok, err := uc.Encode(a.system)
	if err != nil {
		return nil, fmt.Errorf("auth: sign system user: %w", err)
	}
	seed, err := user.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(tok, seed)
}

// WriteCreds mints id's credentials into path, 0600, atomically.
func (a *Authority) WriteCreds(path string, id Identity, ttl time.Duration) error {
	creds, err := a.Creds(id, ttl)
	if err != nil {
		return err
	}
	return writeSecret(path, creds)
}
