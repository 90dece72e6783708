// Command demo is `make run`: a throwaway PostgreSQL, an embedded Kafka
// (kfake), outboxd between them, a few sample orders written through the
// outbox, and every Kafka record printed as it arrives with the slot's lag.
// Ctrl-C stops and removes everything.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/test/harness"
)

func main() {
	once := flag.Bool("once", false, "exit after the first batch of sample orders has been printed")
	every := flag.Duration("every", 3*time.Second, "interval between further sample orders")
	httpAddr := flag.String("http-addr", defaultHTTPAddr, "outboxd's metrics and status address (default: "+defaultHTTPAddr+", or a free port if that is taken)")
	flag.Parse()
	// SIGTERM when the parent (make) dies, however it dies: a SIGKILL of
	// make must not leave this process, outboxd or PostgreSQL behind. The
	// signal runs the same cleanup as Ctrl-C.
	dieWithParent()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "http-addr" })
	addr, err := pickHTTPAddr(*httpAddr, explicit)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if err := run(ctx, *once, *every, addr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, once bool, every time.Duration, httpAddr string) error {
	say("building outboxd")
	bin, err := harness.BuildBinary(ctx, "./cmd/outboxd")
	if err != nil {
		return err
	}
	say("starting a throwaway PostgreSQL 15 (wal_level=logical)")
	pg, err := harness.StartPostgres(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	say("starting an embedded Kafka broker (kfake)")
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		return err
	}
	defer kf.Close()
	brokers := kf.ListenAddrs()

	conn, err := pg.Connect(ctx, "postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	vars := migrations.Vars{Table: "public.outbox", Schema: "public", Publication: "outboxd", Role: "outboxd"}
	for _, name := range []string{migrations.OutboxTable, migrations.Publication} {
		sql, err := migrations.Render(name, vars)
		if err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	say("created table public.outbox and publication outboxd (publish = 'insert')")

	logDir, err := os.MkdirTemp("", "outboxd-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(logDir)
	args := []string{"run", "--postgres", pg.DSN("postgres"), "--kafka-brokers", strings.Join(brokers, ","), "--http-addr", httpAddr}
	say("starting: outboxd " + strings.Join(args, " "))
	ob, err := harness.StartProc(ctx, "outboxd", bin, args, nil, logDir)
	if err != nil {
		return err
	}
	defer func() {
		_ = ob.Signal(syscall.SIGTERM)
		wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		ob.Wait(wctx)
		say("outboxd stopped; its log was:\n" + ob.Log())
	}()
	if err := harness.WaitStreaming(ctx, ob, httpAddr); err != nil {
		return fmt.Errorf("outboxd did not start: %w\n%s", err, ob.Log())
	}
	say("outboxd is streaming; metrics at http://" + httpAddr + "/metrics, status at /status")

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeRegex(), kgo.ConsumeTopics(`^outbox\.event\..*`),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()

	if err := writeSamples(ctx, conn, 1); err != nil {
		return err
	}
	printed := 0
	next := time.Now().Add(every)
	order := 4
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := cl.PollFetches(pctx)
		cancel()
		fetches.EachRecord(func(r *kgo.Record) {
			printed++
			var hs []string
			for _, h := range r.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			fmt.Printf("  kafka ← topic=%s partition=%d offset=%d key=%s headers=[%s]\n          value=%s\n",
				r.Topic, r.Partition, r.Offset, r.Key, strings.Join(hs, " "), r.Value)
		})
		if printed >= 4 && once {
			return printLag(ctx, conn)
		}
		if time.Now().After(next) {
			if err := printLag(ctx, conn); err != nil {
				return err
			}
			if err := writeSamples(ctx, conn, order); err != nil {
				return err
			}
			order++
			next = time.Now().Add(every)
		}
	}
	say("stopping (Ctrl-C)")
	return nil
}

// writeSamples writes order n's events the way a service would: business
// row and outbox row in one transaction.
func writeSamples(ctx context.Context, conn *pgx.Conn, n int) error {
	ins := `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4)`
	if n == 1 {
		say("writing: order-1 created and paid (one transaction), a rolled-back order, order-3 as insert+delete")
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		tx.Exec(ctx, ins, "Order", "order-1", "OrderCreated", `{"id": "order-1", "total": 42.50, "items": 2}`)
		tx.Exec(ctx, ins, "Order", "order-1", "OrderPaid", `{"id": "order-1", "method": "card"}`)
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		tx, _ = conn.Begin(ctx)
		tx.Exec(ctx, ins, "Order", "order-2", "OrderCreated", `{"id": "order-2", "note": "rolled back: never published"}`)
		tx.Rollback(ctx)
		tx, _ = conn.Begin(ctx)
		tx.Exec(ctx, ins, "Order", "order-3", "OrderCreated", `{"id": "order-3"}`)
		tx.Exec(ctx, `DELETE FROM outbox WHERE aggregateid = 'order-3'`)
		tx.Exec(ctx, ins, "Customer", "cust-7", "CustomerRegistered", `{"id": "cust-7", "name": "Ada"}`)
		return tx.Commit(ctx)
	}
	id := fmt.Sprintf("order-%d", n)
	say("writing: " + id + " created")
	_, err := conn.Exec(ctx, ins, "Order", id, "OrderCreated", fmt.Sprintf(`{"id": %q, "total": %d}`, id, n*10))
	return err
}

func printLag(ctx context.Context, conn *pgx.Conn) error {
	var confirmed, current string
	var lag int64
	err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text,
		pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = 'outboxd'`).Scan(&confirmed, &current, &lag)
	if err != nil {
		return err
	}
	say(fmt.Sprintf("slot outboxd: confirmed_flush_lsn=%s wal=%s lag=%d bytes", confirmed, current, lag))
	return nil
}

const defaultHTTPAddr = "127.0.0.1:9187"

// pickHTTPAddr checks that outboxd will be able to listen on addr. The
// default moves to a free port when taken (saying so); an address given
// with -http-addr does not, and the error names the flag that moves it.
func pickHTTPAddr(addr string, explicit bool) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
		return addr, nil
	}
	if explicit {
		return "", fmt.Errorf("-http-addr %s is taken (%v): pick another, e.g. make run RUN_ARGS='-http-addr 127.0.0.1:9188'", addr, err)
	}
	ln, lerr := net.Listen("tcp", "127.0.0.1:0")
	if lerr != nil {
		return "", fmt.Errorf("%s is taken (%v), and no free port on 127.0.0.1: %v", addr, err, lerr)
	}
	free := ln.Addr().String()
	ln.Close()
	say(fmt.Sprintf("%s is taken: outboxd's HTTP endpoints use %s instead (make run RUN_ARGS='-http-addr ADDR' picks one)", addr, free))
	return free, nil
}

func say(s string) { fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), s) }
