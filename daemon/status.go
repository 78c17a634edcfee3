package daemon

import "fmt"

// PrintableAddr shows a data-plane address as text when it is (TCP
// host:port) and as its size and a short hex prefix when it is binary (a
// UCX worker address), so that it fits one line (the ready line, status).
func PrintableAddr(addr []byte) string {
	for _, c := range addr {
		if c < 0x21 || c > 0x7e {
			n := min(len(addr), 8)
			return fmt.Sprintf("binary:%dB:%x…", len(addr), addr[:n])
		}
	}
	return string(addr)
}
