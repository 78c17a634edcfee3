package kvmem

import (
	"errors"
	"fmt"
	"sync"
)

// ErrBlocksBusy is returned when a destination block is already being
// written by another pull.
var ErrBlocksBusy = errors.New("kvmem: blocks busy")

// ErrNotHeld is returned when releasing blocks that are not held: a double
// free. It signals a bug and is counted, never silently ignored.
var ErrNotHeld = errors.New("kvmem: blocks not held")

// BlockTable is the accounting of one region's blocks. A block can be held
// by several holds at once (engines share prefix blocks between requests),
// read by several pulls, and written by at most one pull. It is safe for
// concurrent use.
type BlockTable struct {
	mu      sync.Mutex
	held    []uint16 // holds per block
	reading []uint16 // pulls reading each block (holder side)
	writing []bool   // a pull is writing each block (puller side)
}

// NewBlockTable returns accounting for n blocks, all free.
func NewBlockTable(n uint32) *BlockTable {
	return &BlockTable{held: make([]uint16, n), reading: make([]uint16, n), writing: make([]bool, n)}
}

// Counts is a snapshot of a BlockTable.
type Counts struct {
	Free    uint32 // neither held, read nor written
	Held    uint32 // held by at least one hold
	Reading uint32 // read by at least one pull
	Writing uint32 // written by a pull
}

// Hold marks ids as held by one more hold. ids must be valid.
func (t *BlockTable) Hold(ids []uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ids); err != nil {
		return err
	}
	for _, id := range ids {
		if t.held[id] == ^uint16(0) {
			return fmt.Errorf("kvmem: block %d held by too many holds", id)
		}
	}
	for _, id := range ids {
		t.held[id]++
	}
	return nil
}

// Unhold drops one hold from ids. If any id is not held nothing changes and
// ErrNotHeld is returned.
func (t *BlockTable) Unhold(ids []uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ids); err != nil {
		return err
	}
	for _, id := range ids {
		if t.held[id] == 0 {
			return fmt.Errorf("%w: block %d", ErrNotHeld, id)
		}
	}
	for _, id := range ids {
		t.held[id]--
	}
	return nil
}

// BeginRead marks ids as read by one more pull.
func (t *BlockTable) BeginRead(ids []uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ids); err != nil {
		return err
	}
	for _, id := range ids {
		t.reading[id]++
	}
	return nil
}

// EndRead undoes one BeginRead.
func (t *BlockTable) EndRead(ids []uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		if int(id) < len(t.reading) && t.reading[id] > 0 {
			t.reading[id]--
		}
	}
}

// BeginWrite claims ids as the destination of one pull. It fails with
// ErrBlocksBusy, changing nothing, if another pull is writing any of them.
func (t *BlockTable) BeginWrite(ids []uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(ids); err != nil {
		return err
	}
	for _, id := range ids {
		if t.writing[id] {
			return fmt.Errorf("%w: block %d is being written by another pull", ErrBlocksBusy, id)
		}
	}
	for _, id := range ids {
		t.writing[id] = true
	}
	return nil
}

// EndWrite releases a BeginWrite claim.
func (t *BlockTable) EndWrite(ids []uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		if int(id) < len(t.writing) {
			t.writing[id] = false
		}
	}
}

// Counts returns a snapshot of the accounting.
func (t *BlockTable) Counts() Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	var c Counts
	for i := range t.held {
		busy := false
		if t.held[i] > 0 {
			c.Held++
			busy = true
		}
		if t.reading[i] > 0 {
			c.Reading++
			busy = true
		}
		if t.writing[i] {
			c.Writing++
			busy = true
		}
		if !busy {
			c.Free++
		}
	}
	return c
}

func (t *BlockTable) check(ids []uint32) error {
	return ValidateBlockIDs(ids, uint32(len(t.held)))
}
