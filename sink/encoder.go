package sink

import (
	"context"

	"github.com/outboxd/outboxd/router"
)

// Encoder rewrites a routed record's value before it is handed to the Sink:
// the schema-registry stage (package schema). Encode returns a
// *router.InvalidError (errors.Is router.ErrInvalid) for a record whose
// payload can never be encoded as it is, which takes the relay's
// --on-invalid path; any other error means the encoder cannot work now (a
// registry that is down), and the relay holds delivery at the record as in
// a broker outage. source is the record's table ("schema.table", or
// "message:<prefix>").
type Encoder interface {
	Encode(ctx context.Context, source string, rec *router.Record) error
}
