package kafka

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxd/outboxd/sink"
)

// ErrFenced means another producer with the same transactional id took over.
var ErrFenced = errors.New("kafka: fenced by another outboxd with the same transactional id")

// classify wraps a produce or transaction error in a sink.Error whose kind
// says how the relay handles it. franz-go retries what is retriable for as
// long as it may, so what reaches a record's promise is either final for that
// record (Rejected), a sign that another instance took over (Fenced), or the
// end of this producer's session (Transient: closed client, aborted buffer,
// a timed-out transaction).
func classify(err error, transactional bool) error {
	if err == nil {
		return nil
	}
	var se *sink.Error
	if errors.As(err, &se) {
		return err
	}
	switch {
	case errors.Is(err, kerr.ProducerFenced),
		transactional && errors.Is(err, kerr.InvalidProducerEpoch):
		return &sink.Error{Kind: sink.Fenced, Err: fmt.Errorf("%w: %v", ErrFenced, err)}
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return &sink.Error{Kind: sink.Denied, Err: err}
	case errors.Is(err, kerr.MessageTooLarge),
		errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.CorruptMessage),
		errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.TopicAuthorizationFailed),
		errors.Is(err, kerr.PolicyViolation),
		errors.Is(err, kerr.InvalidTimestamp),
		strings.Contains(err.Error(), "invalid record partitioning choice"):
		return &sink.Error{Kind: sink.Rejected, Err: err}
	}
	return &sink.Error{Kind: sink.Transient, Err: err}
}

// denied marks an authorisation failure outside a record's produce (the
// checkpoint topic, the transactional id) as Denied: waiting cannot fix it.
func denied(err error) error {
	if errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed) {
		return &sink.Error{Kind: sink.Denied, Err: err}
	}
	return err
}

// classifyTxn is classify for the transactional producer, which tells the
// coordinator's own abort from fencing. A Kafka transaction left open
// longer than its timeout is aborted by the coordinator, which bumps the
// producer epoch: every later request of the transaction then fails with
// INVALID_PRODUCER_EPOCH, the error a second producer taking over the
// transactional id causes too. Only the first is cured by a new producer
// session (the relay's Reset, once it holds the slot again), so an
// INVALID_PRODUCER_EPOCH in a transaction open longer than the timeout is
// Transient; PRODUCER_FENCED, and the epoch error of a younger transaction,
// stay Fenced.
func (s *Sink) classifyTxn(err error) error {
	if err == nil || s.txn == nil {
		return classify(err, s.txn != nil)
	}
	if errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.UnknownProducerID) ||
		errors.Is(err, kerr.InvalidProducerIDMapping) || errors.Is(err, kerr.TransactionAbortable) {
		// franz-go would recover this producer id by registering it
		// again: the client is done (spend).
		s.spend()
	}
	if begun := s.begun.Load(); begun != 0 && errors.Is(err, kerr.InvalidProducerEpoch) && !errors.Is(err, kerr.ProducerFenced) {
		if open := time.Since(time.Unix(0, begun)); open >= s.txn.Timeout {
			return &sink.Error{Kind: sink.Transient, Err: fmt.Errorf("kafka: the transaction coordinator aborted the Kafka transaction, open %s, at its timeout (--transaction-timeout %s); starting a new producer session: %w",
				open.Round(time.Millisecond), s.txn.Timeout, err)}
		}
	}
	return classify(err, true)
}
