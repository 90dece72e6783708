package rabbitmq

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// QueueRisk: quorum queues and streams pass; a classic queue, a queue
// without a type (before RabbitMQ reported one) and a non-durable queue
// are named with their fix.
func TestQueueRisk(t *testing.T) {
	for _, c := range []struct {
		q    QueueInfo
		want string
	}{
		{QueueInfo{Name: "q", Type: "quorum", Durable: true}, ""},
		{QueueInfo{Name: "q", Type: "stream", Durable: true}, ""},
		{QueueInfo{Name: "q", Type: "classic", Durable: true}, "queue q is a classic queue"},
		{QueueInfo{Name: "q", Durable: true}, "queue q is a classic queue"},
		{QueueInfo{Name: "q", Type: "classic"}, "queue q is not durable"},
		{QueueInfo{Name: "q", Type: "quorum"}, "queue q is not durable"},
	} {
		got := QueueRisk(c.q)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.q, got, c.want)
		}
	}
}

// Check follows the exchange's bindings (through an exchange bound to it,
// each queue once, the vhost escaped), authenticates as the AMQP user, and
// reports the classic queue only.
func TestManagementCheck(t *testing.T) {
	var paths []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, _ := r.BasicAuth(); u != "user" || p != "secret" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		paths = append(paths, r.URL.EscapedPath())
		var v any
		switch r.URL.EscapedPath() {
		case "/api/exchanges/%2Fv/outboxd/bindings/source":
			v = []map[string]string{{"destination": "qq", "destination_type": "queue"}, {"destination": "fan", "destination_type": "exchange"}, {"destination": "qq", "destination_type": "queue"}}
		case "/api/exchanges/%2Fv/fan/bindings/source":
			v = []map[string]string{{"destination": "cq", "destination_type": "queue"}, {"destination": "outboxd", "destination_type": "exchange"}}
		case "/api/queues/%2Fv/qq":
			v = map[string]any{"name": "qq", "type": "quorum", "durable": true}
		case "/api/queues/%2Fv/cq":
			v = map[string]any{"name": "cq", "type": "classic", "durable": true}
		default:
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(v)
	}))
	defer api.Close()
	m, err := NewManagement(api.URL, "amqp://user:secret@rabbit:5672//v")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	n, err := m.Check(context.Background(), "outboxd", func(dest, why string) { got = append(got, dest+": "+why) })
	if err != nil || n != 2 {
		t.Fatalf("Check: %d queues, %v; want 2", n, err)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "queue cq: queue cq is a classic queue") {
		t.Fatalf("reported %q", got)
	}
	want := []string{"/api/exchanges/%2Fv/outboxd/bindings/source", "/api/exchanges/%2Fv/fan/bindings/source", "/api/queues/%2Fv/qq", "/api/queues/%2Fv/cq"}
	if !slices.Equal(paths, want) {
		t.Fatalf("requests %q, want %q", paths, want)
	}
	if _, err := m.Check(context.Background(), "missing", func(string, string) {}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("missing exchange: %v", err)
	}
	d, _ := NewManagement("", "amqps://u:p@rabbit.example:5671/")
	if d.URL != "https://rabbit.example:15671" || d.VHost != "/" {
		t.Fatalf("derived %+v", d)
	}
}
