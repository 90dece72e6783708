package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Brokers that can lose what they acknowledged. outboxd confirms the slot
// once the broker has acked every event up to it, so an ack the broker can
// lose (a NATS stream with one replica, a RabbitMQ classic queue, a Kafka
// topic that lets an out-of-sync replica lead) is an event lost for good
// once PostgreSQL has recycled its WAL. Each broker's checks (sink/nats,
// sink/rabbitmq, sink/kafka: durability.go) name the setting and its fix;
// outboxd logs each finding once, at Warn, and lists them on /status as
// durability_warnings. They run at startup and, for destinations known only
// once an event goes there (a NATS stream, a Kafka topic), at first use.

// durabilityWarnings collects the findings.
type durabilityWarnings struct {
	log *slog.Logger

	mu   sync.Mutex
	list []string
}

// add records a finding about dest, logging it the first time.
func (d *durabilityWarnings) add(dest, warning string) {
	w := dest + ": " + warning
	d.mu.Lock()
	seen := slices.Contains(d.list, w)
	if !seen {
		d.list = append(d.list, w)
	}
	d.mu.Unlock()
	if !seen {
		d.log.Warn("the broker can lose events it acknowledged: "+warning, "destination", dest)
	}
}

// warnings returns the findings so far, in the order they were found.
func (d *durabilityWarnings) warnings() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.list)
}

// handler adds the findings to h's /status document (a JSON object) as
// durability_warnings; every other path and response passes unchanged.
func (d *durabilityWarnings) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		list := d.warnings()
		if r.URL.Path != "/status" || len(list) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rec := &bufferedResponse{header: http.Header{}, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		var doc map[string]any
		if rec.code == http.StatusOK && strings.HasPrefix(rec.header.Get("Content-Type"), "application/json") &&
			json.Unmarshal(rec.body.Bytes(), &doc) == nil && doc != nil {
			doc["durability_warnings"] = list
			var out bytes.Buffer
			if json.NewEncoder(&out).Encode(doc) == nil {
				rec.body = out
				rec.header.Del("Content-Length")
			}
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.code)
		w.Write(rec.body.Bytes())
	})
}

// bufferedResponse is a ResponseWriter that keeps the response.
type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
	wrote  bool
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(code int) {
	if !b.wrote {
		b.code, b.wrote = code, true
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.wrote = true
	return b.body.Write(p)
}
