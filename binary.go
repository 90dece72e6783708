package outboxd

import (
	"errors"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/wal"
)

// pgoutput's binary mode (wal/binary.go, router/binary.go): the walsender,
// the relay's bottleneck, sends each column's binary send form and the
// router renders the text the server would have sent, so records are the
// same bytes either way. It is asked for only when the router renders every
// column type of the publication's tables under the session's settings.

// binaryTypes is the session's wal.StartOptions.Binary: nil (text) when
// Config.PgoutputBinary is PgoutputBinaryOff or an earlier binary session met a column
// type the router does not render.
func (r *relay) binaryTypes() func(uint32, wal.Settings) bool {
	if r.cfg.PgoutputBinary == PgoutputBinaryOff || r.textOnly {
		return nil
	}
	return router.RendersBinary
}

// binaryEnded notes a session that ended at a relation the router cannot
// render from binary: every later session streams text. Remembered for the
// process's life, so that a relation message the catalog no longer shows
// (a column added and dropped again) cannot make sessions loop.
func (r *relay) binaryEnded(err error) bool {
	if !errors.Is(err, wal.ErrBinaryUnsupported) {
		return false
	}
	r.textOnly = true
	r.log.Info("switching to pgoutput text mode: "+err.Error(), "resume_lsn_unchanged", true)
	return true
}

// streamMode names a session's pgoutput mode for the log.
func streamMode(s sessionStream) string {
	if b, ok := s.(interface{ Binary() bool }); ok && b.Binary() {
		return "binary"
	}
	return "text"
}
