//go:build !amd64

package memcopy

type streamImpl struct {
	name string
	use  func() (restore func())
}

// streamImpls: the portable fallback (copy) only.
func streamImpls() []streamImpl {
	return []streamImpl{{"copy", func() func() { return func() {} }}}
}
