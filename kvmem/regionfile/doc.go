// Package regionfile makes kvmem Regions out of files: it creates, opens
// and attaches region files (mmap, MAP_SHARED), creates connexd's own
// regions as memfds or unnamed files in shm_dir (reserved with fallocate,
// populated with madvise), confines the files engines register to
// region_dir (Dir: openat2 beneath it, owner checks), and reads what
// the host offers (ShmDirPages, Meminfo).
//
// Everything that touches the file system or a system call for KV memory
// lives here, so that kvmem itself only decides (layouts, extents, block
// accounting, the region table and its quotas). Errors wrap kvmem's
// sentinels (kvmem.ErrRegion, kvmem.ErrBadLayout, kvmem.ErrOutsideRegionDir)
// so callers branch on those.
package regionfile
