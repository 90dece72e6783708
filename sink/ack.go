package sink

import (
	"context"

	"github.com/outboxd/outboxd/router"
)

// Ack is where the broker put a record it acknowledged, as its client
// reports it: what a trace of the record's hop can name so that a reader
// finds the span's message in the broker (sink/otel's
// messaging.destination.partition.id, messaging.kafka.offset). A failed
// record's Ack is NoAck.
type Ack struct {
	// Partition and Offset are Kafka's; -1 where the broker has none.
	Partition int32
	Offset    int64
	// Sequence is the JetStream stream sequence of the stored message (a
	// duplicate's: the original's); 0 where the broker has none.
	Sequence uint64
}

// NoAck is the Ack of a record the broker did not take, or of a broker that
// reports no place.
var NoAck = Ack{Partition: -1, Offset: -1}

// Acker is a Sink that can say where each record went. ProduceAck is
// Produce with the broker's Ack passed to done; a decorator that wants the
// place (sink/otel) asks for it with a type assertion, and a sink without
// one (RabbitMQ: a queue has no offset) simply does not implement it.
type Acker interface {
	ProduceAck(ctx context.Context, rec *router.Record, done func(Ack, error))
}

// Callback is Produce's done as an interface: a caller that keeps state
// per record (the relay: the record itself, its transaction, size and
// position) implements it on that state, so that the state and the
// callback are one allocation rather than a struct and a closure.
type Callback interface {
	Done(err error)
}

// CallbackProducer is a Sink that takes a Callback. ProduceCallback is
// Produce calling cb.Done exactly once; the sink keeps nothing of rec past
// the call (it copies what it sends) and nothing of cb past Done, so that
// the caller may reuse both once Done ran. The relay asks for it with a type
// assertion; a sink without it gets Produce and a closure.
type CallbackProducer interface {
	ProduceCallback(ctx context.Context, rec *router.Record, cb Callback)
}

// Releaser is a CallbackProducer that reads nothing of a record's bytes
// (its key, value and header values) once it has called Done: the caller
// may then write them again. The relay then builds each event's record in
// the memory of one the broker acked before (router.RouteInto) rather than
// allocating it, which at a drain's rate is most of what its garbage
// collector scans. A sink that reads a record after its ack must copy what
// it reads first (the NATS sink's duplicate check), or not implement it.
type Releaser interface {
	CallbackProducer
	// ReleasesAtDone marks the promise; it is never called.
	ReleasesAtDone()
}
