package tcp

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"github.com/connex/connex/transport"
)

// helperEnv makes the test binary act as a holder process (see
// runHelperHolder), so tests can freeze and kill a real peer.
const helperEnv = "CONNEX_TCP_TEST_HOLDER"

// helperMem is what the helper holder registers.
func helperMem() []byte { return randomBytes(31, 32<<20) }

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		runHelperHolder()
		return
	}
	os.Exit(m.Run())
}

// runHelperHolder serves helperMem and prints "address key-hex", then runs
// until stdin closes.
func runHelperHolder() {
	b, err := Open(transport.Options{Logger: testLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	reg, err := b.Register(helperMem())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", b.Address(), hex.EncodeToString(reg.RemoteKey()))
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	_ = b.Close()
}
