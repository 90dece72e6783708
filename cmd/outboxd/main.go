// Command outboxd relays transactional-outbox rows from a PostgreSQL logical
// replication slot (pgoutput) to a broker, confirming the slot only after it
// has acked every event before it.
//
// One file per subcommand; each has a Run-style entry taking a context and
// its arguments.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxd/outboxd/internal/pgerr"
)

// version is set at build time: -ldflags "-X main.version=…".
var version = "dev"

const usage = `outboxd relays outbox rows from a PostgreSQL logical replication slot to Kafka, NATS JetStream or RabbitMQ.

Usage:
  outboxd run      stream the slot to the broker (the daemon)
  outboxd setup    create the outbox table, publication and slot
  outboxd status   show replication slots, lag and the publication's tables
  outboxd slot drop --slot NAME   drop a replication slot
  outboxd inbox    deliver events from the broker into the consumer database's inbox_events table
  outboxd inbox list|release   show or release parked events of package inbox consumers
  outboxd version  print the version

Run "outboxd <command> --help" for a command's options.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// env is how commands read the environment (a parameter, so tests need no globals).
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	e := env{stdout: stdout, stderr: stderr, getenv: getenv}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = runCommand(ctx, e, args[1:])
	case "setup":
		err = setupCommand(ctx, e, args[1:])
	case "status":
		err = statusCommand(ctx, e, args[1:])
	case "slot":
		err = slotCommand(ctx, e, args[1:])
	case "inbox":
		err = inboxCommand(ctx, e, args[1:])
	case "version", "--version":
		fmt.Fprintln(stdout, "outboxd", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "outboxd: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "outboxd %s: %v\n", args[0], pgerr.RootCauseFirst(err))
		return 1
	}
	return 0
}
