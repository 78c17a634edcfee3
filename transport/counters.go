package transport

// Counters is implemented by backends that count their own work for
// operators (Caps.Counters says a backend implements it): connexd exports
// each Counter as the Prometheus counter connex_data_plane_<Name>_total.
// The TCP backend counts the requests it served by kind and the holders
// its readers fell back to an older wire protocol for, which shows a
// rolling upgrade's mixed versions (and the slower reads they cost).
type Counters interface {
	// Counters lists the backend's counters; the list is fixed for the
	// backend's life.
	Counters() []Counter
}

// Counter is one monotonic count of a backend's.
type Counter struct {
	// Name is the counter's name in snake case, without connexd's
	// connex_data_plane_ prefix or _total suffix (e.g. tcp_gathers_served).
	Name string
	// Help says what it counts, for the metric's HELP line.
	Help string
	// Value reads the count; safe from any goroutine.
	Value func() uint64
}
