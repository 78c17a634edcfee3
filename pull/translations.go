package pull

import (
	"sync"

	"github.com/connex/connex/kvmem"
)

// translationCache keeps the translations pullers planned, by the pair of
// layouts: planning a tile walks every vector (or element) of its heads,
// up to milliseconds for the CPU order's transposed K, and the pairs of
// engines a member pulls between are few. Translations are immutable.
type translationCache struct {
	mu sync.Mutex
	m  map[[2]kvmem.Layout]*kvmem.Translation
}

// maxTranslations bounds the cache; past it, it starts afresh.
const maxTranslations = 64

// get returns the translation from src to dst (kvmem.Translate).
func (c *translationCache) get(src, dst kvmem.Layout) (*kvmem.Translation, error) {
	k := [2]kvmem.Layout{src, dst}
	c.mu.Lock()
	t, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := kvmem.Translate(src, dst)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxTranslations {
		c.m = map[[2]kvmem.Layout]*kvmem.Translation{}
	}
	c.m[k] = t
	return t, nil
}
