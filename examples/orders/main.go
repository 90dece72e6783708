// Command orders is the producing half of the example: an orders service
// that writes its business row and the outbox row in one transaction, so the
// event exists if and only if the order does. outboxd relays the outbox to
// Kafka (topic outbox.event.Order, key = the account, so one account's
// orders keep their order); billing applies them.
//
//	orders -postgres postgres://.../orders -n 100
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/migrations"
)

// Schema is the orders table; the outbox and publication come from
// migrations (what `outboxd setup` runs).
const Schema = `CREATE TABLE IF NOT EXISTS orders (
    id      bigint PRIMARY KEY,
    account text   NOT NULL,
    cents   bigint NOT NULL,
    seq     bigint NOT NULL
);`

// PlaceOrder is the whole pattern on the producing side: business row and
// event in one transaction.
func PlaceOrder(ctx context.Context, tx pgx.Tx, id int64, account string, cents, seq int64) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, account, cents, seq) VALUES ($1, $2, $3, $4)`, id, account, cents, seq); err != nil {
		return err
	}
	payload, err := json.Marshal(map[string]any{"order_id": id, "account": account, "cents": cents, "seq": seq})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('Order', $1, 'OrderPlaced', $2)`, account, payload)
	return err
}

func main() {
	dsn := flag.String("postgres", os.Getenv("ORDERS_POSTGRES"), "the orders database")
	n := flag.Int("n", 10, "orders to place")
	accounts := flag.Int("accounts", 3, "accounts to spread them over")
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	vars := migrations.Vars{Table: "public.outbox", Schema: "public", Publication: "outboxd"}
	var ddl string
	for _, name := range []string{migrations.OutboxTable, migrations.Publication} {
		sql, err := migrations.Render(name, vars)
		if err != nil {
			log.Fatal(err)
		}
		ddl += sql
	}
	if _, err := pool.Exec(ctx, ddl+Schema); err != nil {
		log.Fatal(err)
	}
	var next int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) + 1 FROM orders`).Scan(&next); err != nil {
		log.Fatal(err)
	}
	for i := range int64(*n) {
		id := next + i
		account := fmt.Sprintf("acct-%d", id%int64(*accounts))
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var seq int64
			if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) + 1 FROM orders WHERE account = $1`, account).Scan(&seq); err != nil {
				return err
			}
			return PlaceOrder(ctx, tx, id, account, 100+id%7, seq)
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("placed %d orders\n", *n)
}
