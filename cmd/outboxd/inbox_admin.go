package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/internal/redact"
)

// The operator's half of OnPoison ParkKey: outboxd inbox list shows the
// parked aggregates of a consumer's inbox, grouped by error, and outboxd inbox
// release marks one released, after which the running consumer replays its
// events in order (package inbox, Release).

const inboxListSummary = `Lists the aggregates (keys) a consumer has parked in its inbox_parked table,
grouped by the error of their first (poison) event: each key with how many of
its events wait, the poison event's id, attempts and when it was parked.
"released" marks a key whose release the running consumer is replaying.`

const inboxReleaseSummary = `Releases a parked aggregate after the cause of its poison event was fixed:
the running consumer of --name replays the key's parked events in order
through its handler (within its ReleaseInterval, 1s by default), then lets
the key's new events through. An event that fails again parks the key again.`

// inboxAdmin runs outboxd inbox list and outboxd inbox release.
func inboxAdmin(verb string, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return inboxAdminTo(ctx, os.Stdout, os.Getenv, verb, args)
}

type inboxAdminOptions struct {
	Postgres, Schema, Name, Key string
}

func inboxAdminTo(ctx context.Context, w io.Writer, getenv func(string) string, verb string, args []string) (err error) {
	var o inboxAdminOptions
	defer func() { err = redact.Err(err, o.Postgres) }()
	set := newOptionSet("inbox " + verb)
	set.fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL connection string of the consumer's database (where the inbox tables are)")
	registerPostgresFile(set, &o.Postgres)
	set.fs.StringVar(&o.Schema, "inbox-schema", "public", "schema of the inbox tables")
	set.fs.StringVar(&o.Name, "name", "", "the consumer's inbox name (inbox.Config.Name, by default its Group) (required)")
	summary := inboxListSummary
	switch verb {
	case "list":
	case "release":
		summary = inboxReleaseSummary
		set.fs.StringVar(&o.Key, "key", "", "the aggregate id (record key) to release (required)")
	default:
		return fmt.Errorf("unknown inbox sub-command %q: want list or release", verb)
	}
	if err := set.parseOrHelp(args, getenv, w, summary); err != nil {
		return err
	}
	var errs []error
	o.Postgres = orLibpq(o.Postgres, getenv)
	if o.Postgres == "" {
		errs = append(errs, errors.New("--postgres (OUTBOXD_POSTGRES) is required: the consumer's database"))
	}
	if o.Name == "" {
		errs = append(errs, errors.New("--name (OUTBOXD_NAME) is required: the consumer's inbox name"))
	}
	if verb == "release" && o.Key == "" && !keySet(set.fs) {
		errs = append(errs, errors.New("--key is required: the aggregate to release (outboxd inbox list shows them)"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, o.Postgres)
	if err != nil {
		return fmt.Errorf("connecting to the consumer database: %w", err)
	}
	defer pool.Close()
	if verb == "release" {
		n, err := inbox.Release(ctx, pool, o.Schema, o.Name, o.Key)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("nothing parked and unreleased under key %q for consumer %q (outboxd inbox list --name %s shows what is parked)", o.Key, o.Name, o.Name)
		}
		fmt.Fprintf(w, "released %d events of key %q; the running consumer %s replays them in order\n", n, o.Key, o.Name)
		return nil
	}
	aggs, err := inbox.ListParked(ctx, pool, o.Schema, o.Name)
	if err != nil {
		return err
	}
	printParked(w, o.Name, aggs)
	return nil
}

// keySet reports whether --key was given (an empty key is a valid one: the
// events without a key).
func keySet(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "key" })
	return set
}

// printParked prints aggs grouped by error, the largest group first.
func printParked(w io.Writer, name string, aggs []inbox.ParkedAggregate) {
	if len(aggs) == 0 {
		fmt.Fprintf(w, "consumer %s has nothing parked\n", name)
		return
	}
	groups := map[string][]inbox.ParkedAggregate{}
	var errs []string
	for _, a := range aggs {
		if groups[a.Error] == nil {
			errs = append(errs, a.Error)
		}
		groups[a.Error] = append(groups[a.Error], a)
	}
	slices.SortStableFunc(errs, func(a, b string) int { return len(groups[b]) - len(groups[a]) })
	for _, e := range errs {
		g := groups[e]
		events := 0
		for _, a := range g {
			events += a.Events
		}
		fmt.Fprintf(w, "error: %s\n  %d aggregates, %d events\n", e, len(g), events)
		for _, a := range g {
			state := ""
			if a.Released {
				state = "  released (replaying)"
			}
			fmt.Fprintf(w, "  key %q  %d events  first %s  attempts %d  parked %s%s\n",
				a.Key, a.Events, a.FirstID, a.Attempts, a.ParkedAt.UTC().Format("2006-01-02T15:04:05Z"), state)
		}
	}
}
