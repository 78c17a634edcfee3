package daemon

import (
	"errors"
	"fmt"
	"os"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// createdInfo is region.create's answer for m: the region's info and, with
// the region socket on, where and with which one-use token the calling
// engine receives the memory's descriptor (kvmem/handover). The reply goes
// only to the calling engine's inbox, so only it learns the token.
func (d *Daemon) createdInfo(m *kvmem.Mapped) (*messages.RegionInfo, error) {
	info := regionInfo(m)
	if d.handover == nil {
		return info, nil
	}
	tok, err := d.handover.Grant(m.Engine, m.ID, m)
	if err != nil {
		return nil, fmt.Errorf("region %s/%s: %w", m.Engine, m.ID, err)
	}
	info.HandoverSocket, info.HandoverToken = d.handover.Addr(), tok
	return info, nil
}

// openCreated opens the memory of the region granted as ref, for the
// region socket to send: only while that very region (not one created
// since under the same ids) is still in the table and not broken. It holds
// a reference while it opens the region's /proc/self/fd path, so the
// descriptor that path names cannot be closed (and its number reused by
// another file) in between.
func (d *Daemon) openCreated(engine, region string, ref any) (*os.File, error) {
	m, release, err := d.regions.Acquire(engine, region)
	if err != nil {
		return nil, errors.New("the region is gone (engine.gone, or connexd dropped it): create it again")
	}
	defer release()
	if m != ref {
		return nil, errors.New("the region was created again since this token was issued: use the newer token")
	}
	if err := m.CheckBroken(); err != nil {
		return nil, errors.New("the region is broken (its memory faulted): create it again")
	}
	f, err := os.OpenFile(m.Region.Path, os.O_RDWR, 0)
	if err != nil {
		d.log.Warn("region socket: cannot open a created region's memory", "engine", engine, "region", region, "path", m.Region.Path, "err", err)
		return nil, errors.New("connexd cannot open the region's memory (its log says why)")
	}
	return f, nil
}
