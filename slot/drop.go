package slot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/pgquote"
)

// DropOptions say how Drop treats a slot in use.
type DropOptions struct {
	// Force terminates whatever holds the slot (pg_terminate_backend) and
	// drops it once it lets go, within Wait.
	Force bool
	Wait  time.Duration
	// Terminated, if set, is told about each holder Force terminated.
	Terminated func(s Slot)
}

// Drop drops a slot, so that PostgreSQL stops keeping WAL for it. It
// returns the slot as it was last read; gone reports that someone else
// dropped it meanwhile. A slot in use is refused, naming its holder, unless
// o.Force.
func Drop(ctx context.Context, q Querier, name string, o DropOptions) (s Slot, gone bool, err error) {
	db, err := queryOne(ctx, q, "SELECT current_database()")
	if err != nil {
		return Slot{}, false, err
	}
	s, found, err := Get(ctx, q, name)
	if err != nil {
		return Slot{}, false, err
	}
	if !found {
		return Slot{}, false, fmt.Errorf("replication slot %q does not exist", name)
	}
	if s.Type == "logical" && s.Database != db[0] {
		return s, false, fmt.Errorf("replication slot %q belongs to database %q, but --postgres connects to %q; a logical slot is dropped from its own database", name, s.Database, db[0])
	}
	if s.Active && !o.Force {
		return s, false, fmt.Errorf("replication slot %q is active for PID %d%s; stop that process first, or use --force to terminate it", name, s.ActivePID, s.Holder.Who())
	}
	deadline := time.Now().Add(o.Wait)
	terminated := map[int]bool{}
	for {
		if s.Active {
			// Terminate each holder once; a new PID means a consumer
			// reconnected (an outboxd retrying), which is terminated too.
			if !terminated[s.ActivePID] {
				ok, err := queryOne(ctx, q, "SELECT pg_terminate_backend("+strconv.Itoa(s.ActivePID)+")")
				if err != nil {
					return s, false, fmt.Errorf("terminate PID %d holding slot %q: %w", s.ActivePID, name, err)
				}
				terminated[s.ActivePID] = true
				if ok[0] == "t" && o.Terminated != nil {
					o.Terminated(s)
				}
			}
		} else {
			_, err := q.Exec(ctx, "SELECT pg_drop_replication_slot("+pgquote.Literal(name)+")").ReadAll()
			if err == nil {
				return s, false, nil
			}
			var pgErr *pgconn.PgError
			// 55006 object_in_use: a consumer took the slot in between.
			if !errors.As(err, &pgErr) || pgErr.Code != "55006" {
				return s, false, fmt.Errorf("drop replication slot %q: %w", name, err)
			}
			if !o.Force {
				return s, false, fmt.Errorf("%w; use --force to terminate its holder", err)
			}
		}
		if time.Now().After(deadline) {
			return s, false, fmt.Errorf("replication slot %q is still active for PID %d after %s; whatever holds it keeps reconnecting: stop it, then retry", name, s.ActivePID, o.Wait)
		}
		select {
		case <-ctx.Done():
			return s, false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if s, found, err = Get(ctx, q, name); err != nil || !found {
			return s, err == nil, err
		}
	}
}

// Who is " (app from addr)", or as much of it as is visible; "" if nothing is.
func (h Holder) Who() string {
	switch {
	case h.Application != "" && h.Client != "":
		return " (" + h.Application + " from " + h.Client + ")"
	case h.Application != "":
		return " (" + h.Application + ")"
	case h.Client != "":
		return " (from " + h.Client + ")"
	}
	return ""
}
