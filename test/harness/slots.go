package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SlotState is a row of pg_replication_slots. LSNs are 0 when NULL.
type SlotState struct {
	Name              string
	Plugin            string // "" for physical slots
	Database          string
	Active            bool
	ActivePID         int // 0 when inactive
	RestartLSN        uint64
	ConfirmedFlushLSN uint64
}

// SlotInfo reads the state of replication slot slot. A missing slot yields
// an error wrapping pgx.ErrNoRows.
func SlotInfo(ctx context.Context, conn *pgx.Conn, slot string) (SlotState, error) {
	var (
		s                  = SlotState{Name: slot}
		plugin, database   *string
		pid                *int32
		restart, confirmed *string
	)
	err := conn.QueryRow(ctx, `SELECT plugin, database, active, active_pid,
		restart_lsn::text, confirmed_flush_lsn::text
		FROM pg_replication_slots WHERE slot_name = $1`, slot).
		Scan(&plugin, &database, &s.Active, &pid, &restart, &confirmed)
	if err != nil {
		return SlotState{}, fmt.Errorf("slot %q: %w", slot, err)
	}
	if plugin != nil {
		s.Plugin = *plugin
	}
	if database != nil {
		s.Database = *database
	}
	if pid != nil {
		s.ActivePID = int(*pid)
	}
	for _, f := range []struct {
		src *string
		dst *uint64
	}{{restart, &s.RestartLSN}, {confirmed, &s.ConfirmedFlushLSN}} {
		if f.src == nil {
			continue
		}
		if *f.dst, err = ParseLSN(*f.src); err != nil {
			return SlotState{}, fmt.Errorf("slot %q: %w", slot, err)
		}
	}
	return s, nil
}

// CurrentWALLSN returns pg_current_wal_lsn().
func CurrentWALLSN(ctx context.Context, conn *pgx.Conn) (uint64, error) {
	var text string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&text); err != nil {
		return 0, fmt.Errorf("reading current WAL LSN: %w", err)
	}
	return ParseLSN(text)
}

// ParseLSN parses the pg_lsn text form "X/Y" (two hex halves).
func ParseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("parsing LSN %q: missing '/'", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parsing LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parsing LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}

// FormatLSN formats lsn the way PostgreSQL prints a pg_lsn ("%X/%X").
func FormatLSN(lsn uint64) string {
	return fmt.Sprintf("%X/%X", lsn>>32, uint32(lsn))
}
