package kvmem

// heapOpener is a RegionOpener over heap bytes, so the table's tests need
// no files: each Open maps fresh zeroed memory of the layout's size under
// path, as an engine's file of that name would be, and counts the regions
// freed and whether the table closed it.
type heapOpener struct {
	opened, freed int
	closed        bool
}

func (h *heapOpener) Open(path string, l Layout) (*Region, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	h.opened++
	return NewRegion(path, l, MemoryFile, make([]byte, l.Size()), func() error { h.freed++; return nil })
}

func (h *heapOpener) Close() error {
	h.closed = true
	return nil
}
