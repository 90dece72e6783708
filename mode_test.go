package outboxd

// The relay's mode, for tests that look at its state.
func (r *relay) xo() *exactlyOnce  { return r.mode.(*exactlyOnce) }
func (r *relay) alo() *atLeastOnce { return r.mode.(*atLeastOnce) }
