package inbox_test

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/inbox"
)

// A billing consumer: each order event adds to a balance, exactly once. The
// inbox tables come from migrations.InboxTables.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://billing@127.0.0.1/billing")
	if err != nil {
		panic(err)
	}
	c, err := inbox.New(inbox.Config{
		Brokers: []string{"127.0.0.1:9092"},
		Group:   "billing",
		Topics:  []string{"outbox.event.Order"},
		DB:      pool,
		Handler: func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
			var o struct {
				Account string `json:"account"`
				Cents   int64  `json:"cents"`
			}
			if err := json.Unmarshal(ev.Value, &o); err != nil {
				return err // retried, then parked
			}
			_, err := tx.Exec(ctx, `UPDATE balances SET cents = cents + $2 WHERE account = $1`, o.Account, o.Cents)
			return err
		},
	})
	if err != nil {
		panic(err)
	}
	_ = c.Run // c.Run(ctx) consumes until ctx ends
}
