package nats

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/sink"
)

// What retrying cannot fix is Rejected (--on-invalid applies); the rest,
// including the order chain's refusal, holds.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want sink.Kind
	}{
		{&jetstream.APIError{Code: 400, ErrorCode: codeMessageTooLarge, Description: "message size exceeds maximum allowed"}, sink.Rejected},
		{&jetstream.APIError{Code: 400, ErrorCode: codeWrongLastMsgID, Description: "wrong last msg ID: A"}, sink.Transient},
		{&jetstream.APIError{Code: 503, ErrorCode: codeStoreFailed, Description: "maximum messages exceeded"}, sink.Transient},
		{&jetstream.APIError{Code: 400, ErrorCode: codeStreamSealed, Description: "invalid operation on sealed stream"}, sink.Rejected},
		{nats.ErrMaxPayload, sink.Rejected},
		{fmt.Errorf("%w: Permissions Violation for Publish to \"x\"", nats.ErrPermissionViolation), sink.Rejected},
		{nats.ErrBadSubject, sink.Rejected},
		{jetstream.ErrNoStreamResponse, sink.Transient},
		{nats.ErrDisconnected, sink.Transient},
		{jetstream.ErrAsyncPublishTimeout, sink.Transient},
		{nats.ErrConnectionClosed, sink.Transient},
		{&sink.Error{Kind: sink.Rejected, Err: errors.New("kept")}, sink.Rejected},
	} {
		got := classify(c.err)
		if sink.KindOf(got) != c.want {
			t.Errorf("%v: %v, want %v", c.err, sink.KindOf(got), c.want)
		}
		// The engine advises --on-invalid dead-letter where it applies
		// (not when it is on already); the sink says what to fix.
		if got != nil && strings.Contains(got.Error(), "dead-letter") {
			t.Errorf("%v: %q advises dead-letter", c.err, got)
		}
	}
	if classify(nil) != nil {
		t.Error("classify(nil) is not nil")
	}
}

func TestRedactURL(t *testing.T) {
	got := redactURL("nats://u:secret@a:4222,nats://b:4222,tls://t@c:4222")
	if want := "nats://REDACTED@a:4222,nats://b:4222,tls://REDACTED@c:4222"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

func TestValidSubject(t *testing.T) {
	for subj, ok := range map[string]bool{
		"outbox.event.Order": true, "outbox.event.Order.order-1": true, `a."quoted"`: true, "a.b*c": true,
		"": false, "a..b": false, ".a": false, "a.": false, "a.*": false, "a.>": false, "a.b c": false, "a.b\tc": false,
	} {
		if err := validSubject(subj); (err == nil) != ok {
			t.Errorf("%q: %v", subj, err)
		}
	}
}
