package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/migrations"
)

// outboxd with --envelope cloudevents, binary then structured, on each
// broker: the consumer sees the same payload in Value in both modes, the id
// and type it deduplicates and routes on, and the attributes in
// Event.CloudEvent (the NATS subject percent-decoded: the account has a
// space).
func TestCloudEventsIntoInbox(t *testing.T) {
	for _, broker := range []string{"kafka", "nats", "rabbitmq"} {
		t.Run(broker, func(t *testing.T) {
			w := newWorld(t, 4*time.Minute, broker)
			ddl, err := migrations.InboxTables("public")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.billing.Exec(w.ctx, ddl); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			got := map[int64]*inbox.Event{}
			cfg := inbox.Config{Group: "ce", Topics: []string{"outbox.event.Order"}, DB: w.billing, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Handler: func(_ context.Context, _ pgx.Tx, ev *inbox.Event) error {
					var p struct {
						OrderID int64 `json:"order_id"`
					}
					if err := json.Unmarshal(ev.Value, &p); err != nil {
						return inbox.Permanent(fmt.Errorf("value %q: %w", ev.Value, err))
					}
					mu.Lock()
					got[p.OrderID] = ev
					mu.Unlock()
					return nil
				}}
			switch {
			case w.kafka != nil:
				cfg.Brokers = w.kafka.Brokers()
			case w.nats != nil:
				cfg.Broker = w.nats.URL()
			default:
				cfg.Broker, cfg.Topics = w.rabbit.URL(), []string{billingQueue}
			}
			for i, mode := range []string{"binary", "structured"} {
				if i > 0 {
					if err := w.relay.Signal(syscall.SIGTERM); err != nil {
						t.Fatal(err)
					}
					if _, err := w.relay.Wait(w.ctx); err != nil {
						t.Fatal(err)
					}
				}
				w.startRelay("--envelope", "cloudevents", "--cloudevents-mode", mode, "--cloudevents-source", "/shop/orders")
				o := order{id: int64(i + 1), account: "acct " + mode, cents: 100, seq: 1}
				if err := w.placeOrder(w.ctx, o, false); err != nil {
					t.Fatal(err)
				}
			}
			c, err := inbox.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(w.ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			for {
				mu.Lock()
				n := len(got)
				mu.Unlock()
				if n == 2 {
					break
				}
				if w.ctx.Err() != nil {
					t.Fatalf("%d of 2 events applied", n)
				}
				time.Sleep(20 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			for id, mode := range map[int64]string{1: "binary", 2: "structured"} {
				ev := got[id]
				if ev == nil {
					t.Errorf("%s: order %d not applied; applied %v (a Value that was not the payload has no order_id)", mode, id, slices.Collect(maps.Keys(got)))
					continue
				}
				ce := ev.CloudEvent
				if ce["specversion"] != "1.0" || ce["type"] != "OrderPlaced" || ce["source"] != "/shop/orders" ||
					ce["subject"] != "acct "+mode || ce["id"] == "" || ce["id"] != ev.ID || ev.Type != "OrderPlaced" {
					t.Errorf("%s: ID %q Type %q CloudEvent %v", mode, ev.ID, ev.Type, ce)
				}
				if !strings.HasPrefix(strings.TrimSpace(string(ev.Value)), "{") || strings.Contains(string(ev.Value), "specversion") {
					t.Errorf("%s: Value %q is not the payload", mode, ev.Value)
				}
			}
		})
	}
}
