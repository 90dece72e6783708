package kafka

import (
	"errors"
	"fmt"
	"strings"

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
