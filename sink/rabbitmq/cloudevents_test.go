package rabbitmq

import (
	"testing"

	"github.com/outboxd/outboxd/router"
)

// The AMQP binding maps datacontenttype (and the structured mode's media
// type) to the message's content-type property.
func TestCloudEventsContentTypeProperty(t *testing.T) {
	rec := router.Record{Value: []byte(`{}`), Headers: []router.Header{
		{Key: "cloudEvents:id", Value: []byte("1")}, {Key: ContentTypeHeader, Value: []byte("application/json")}}}
	m := message(&rec, nil)
	if m.ContentType != "application/json" || m.Headers["cloudEvents:id"] != "1" {
		t.Fatalf("content type %q, headers %v", m.ContentType, m.Headers)
	}
	if router.CEAMQP.ContentType != ContentTypeHeader {
		t.Fatalf("router.CEAMQP puts the content type in %q, the sink reads %q", router.CEAMQP.ContentType, ContentTypeHeader)
	}
}
