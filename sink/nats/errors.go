package nats

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/sink"
)

// JetStream error codes the sink tells apart (nats-server's
// server/errors.json).
const (
	codeMessageTooLarge jetstream.ErrorCode = 10054 // JSStreamMessageExceedsMaximumErr
	codeWrongLastMsgID  jetstream.ErrorCode = 10070 // JSStreamWrongLastMsgIDErrF
	codeStoreFailed     jetstream.ErrorCode = 10077 // JSStreamStoreFailedF: a discard-new stream's limit, among others
	codeStreamSealed    jetstream.ErrorCode = 10109 // JSStreamSealedErr
)

// classify wraps a publish error in a sink.Error whose kind says how the
// relay handles it. Rejected is what retrying the same bytes cannot fix: a
// message larger than the server's max_payload or the stream's
// max_msg_size, a sealed stream, a subject the user may not publish to, an
// invalid subject. Everything else holds (Transient): a lost connection, a
// stream with no leader or none at all (Check tells that case apart before
// the publish), a full stream that discards new messages, an ack timeout,
// and a message refused because its predecessor is missing from the stream
// (the order fence: the replay resends both).
func classify(err error) error {
	if err == nil {
		return nil
	}
	var se *sink.Error
	if errors.As(err, &se) {
		return err
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch {
		case api.ErrorCode == codeMessageTooLarge:
			return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("%w: raise the stream's max_msg_size", err)}
		case api.ErrorCode == codeStreamSealed:
			return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("%w: the stream that captures the subject is sealed, for good, and takes no more messages: move the subject to a stream that is not sealed", err)}
		case api.ErrorCode == codeStoreFailed && strings.Contains(api.Description, "exceeded"):
			return &sink.Error{Kind: sink.Transient, Err: fmt.Errorf("publish: %w: the stream is full and discards new messages (discard: new); outboxd holds the event and retries: raise the limit (nats stream edit <stream> --max-msgs, --max-bytes or --max-msgs-per-subject), or let its consumers free room", err)}
		}
	}
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("%w: raise the server's max_payload", err)}
	case errors.Is(err, nats.ErrPermissionViolation):
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("%w: allow outboxd's user to publish to the subject, or route the event elsewhere", err)}
	case errors.Is(err, nats.ErrBadSubject):
		return &sink.Error{Kind: sink.Rejected, Err: err}
	}
	if errors.Is(err, nats.ErrReconnectBufExceeded) { // nats.go's way of saying: not connected, and no buffer
		err = fmt.Errorf("nats: not connected to the server: %w", err)
	}
	return &sink.Error{Kind: sink.Transient, Err: fmt.Errorf("publish: %w", err)}
}

// isNoStream reports a publish no stream answered: no stream captures the
// subject (or, in a cluster, the stream has no leader yet).
func isNoStream(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

var publishDenied = regexp.MustCompile(`Publish to "(\S+)"`)

// asyncError is the connection's error callback: a permissions violation
// for a publish comes here rather than as a PubAck, so the records waiting
// on that subject are rejected now instead of timing out.
func (s *Sink) asyncError(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		s.log.Warn("nats: asynchronous error", "err", err)
		return
	}
	m := publishDenied.FindStringSubmatch(err.Error())
	if m == nil {
		s.log.Warn("nats: permissions violation", "err", err)
		return
	}
	s.mu.Lock()
	var denied []*publish
	for msg, p := range s.pending {
		if msg.Subject == m[1] {
			denied = append(denied, p)
			delete(s.pending, msg)
		}
	}
	s.mu.Unlock()
	if len(denied) == 0 {
		return
	}
	s.fail(err)
	for _, p := range denied {
		p.finish(sink.NoAck, classify(err))
	}
}
