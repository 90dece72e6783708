package rabbitmq

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Durability. A confirm (basic.ack) means every queue the message was
// routed to has taken it: a quorum queue on a majority of its members, a
// classic queue on its one node (and its mirrors, which lose confirmed
// messages in partitions and failovers). So a classic queue loses confirmed
// messages with its node's disk, and a non-durable queue with any restart,
// while outboxd has confirmed the slot past them. AMQP 0-9-1 cannot list
// what is bound to an exchange, nor say a queue's type; the management
// plugin's HTTP API can, so the check asks it.

// QueueInfo is what the management API says of a queue bound to the
// exchange.
type QueueInfo struct {
	Name    string `json:"name"`
	Type    string `json:"type"` // classic, quorum, stream
	Durable bool   `json:"durable"`
}

// QueueRisk says why a queue can lose messages it confirmed ("" if
// nothing says so): not durable, or not a quorum queue (or a stream, which
// is replicated the same way).
func QueueRisk(q QueueInfo) string {
	switch {
	case !q.Durable:
		return fmt.Sprintf("queue %s is not durable: a restart of its node loses it and every confirmed message in it; declare it durable, as a quorum queue (x-queue-type: quorum)", q.Name)
	case q.Type == "quorum" || q.Type == "stream":
		return ""
	}
	typ := q.Type
	if typ == "" {
		typ = "classic"
	}
	return fmt.Sprintf("queue %s is a %s queue: a confirm means one node stored the message (mirrors, if a policy adds them, lose confirmed messages on failover), so losing that node or its disk loses confirmed events; "+
		"use a quorum queue (x-queue-type: quorum) on a cluster of three nodes", q.Name, typ)
}

// Management reads the management plugin's HTTP API.
type Management struct {
	URL      string // http://host:15672
	User     string
	Password string
	VHost    string
	Client   *http.Client // nil: http.DefaultClient
}

// NewManagement is the API at base for the user and vhost of the AMQP
// URI amqpURL. An empty base is the AMQP host on the plugin's default
// port (15672, or 15671 with https for amqps).
func NewManagement(base, amqpURL string) (Management, error) {
	uri, err := amqp.ParseURI(amqpURL)
	if err != nil {
		return Management{}, err
	}
	if base == "" {
		base = fmt.Sprintf("http://%s:15672", uri.Host)
		if uri.Scheme == "amqps" {
			base = fmt.Sprintf("https://%s:15671", uri.Host)
		}
	}
	return Management{URL: strings.TrimRight(base, "/"), User: uri.Username, Password: uri.Password, VHost: uri.Vhost}, nil
}

// BoundQueues returns the queues that messages published to exchange can
// reach: bound to it, or to an exchange bound to it.
func (m Management) BoundQueues(ctx context.Context, exchange string) ([]QueueInfo, error) {
	var names []string
	seen := map[string]bool{exchange: true}
	for todo := []string{exchange}; len(todo) > 0; {
		e := todo[0]
		todo = todo[1:]
		var bindings []struct {
			Destination string `json:"destination"`
			Type        string `json:"destination_type"`
		}
		if err := m.get(ctx, "/api/exchanges/"+url.PathEscape(m.VHost)+"/"+url.PathEscape(e)+"/bindings/source", &bindings); err != nil {
			return nil, err
		}
		for _, b := range bindings {
			switch {
			case b.Type == "queue" && !slices.Contains(names, b.Destination):
				names = append(names, b.Destination)
			case b.Type == "exchange" && !seen[b.Destination]:
				seen[b.Destination] = true
				todo = append(todo, b.Destination)
			}
		}
	}
	out := make([]QueueInfo, 0, len(names))
	for _, n := range names {
		var q QueueInfo
		if err := m.get(ctx, "/api/queues/"+url.PathEscape(m.VHost)+"/"+url.PathEscape(n), &q); err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, nil
}

func (m Management) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.URL+path, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(m.User, m.Password)
	c := m.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("management API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("management API: GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("management API: GET %s: %w", path, err)
	}
	return nil
}

// Check reports (dest, warning) for each queue bound to exchange that can
// lose what it confirmed, and returns how many queues it looked at.
func (m Management) Check(ctx context.Context, exchange string, report func(dest, warning string)) (int, error) {
	qs, err := m.BoundQueues(ctx, exchange)
	if err != nil {
		return 0, err
	}
	for _, q := range qs {
		if why := QueueRisk(q); why != "" {
			report("queue "+q.Name, why)
		}
	}
	return len(qs), nil
}
