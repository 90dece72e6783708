package slot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Listed is a slot as `outboxd status --json` shows it (Slot's JSON), and
// whether it is the one asked about.
type Listed struct {
	Slot
	Selected bool
}

func (s Listed) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(s.Slot)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(b[:len(b)-1], `,"selected":%t}`, s.Selected), nil
}

// PublicationStatus is the publication as `outboxd status` shows it.
type PublicationStatus struct {
	Name      string   `json:"name"`
	Exists    bool     `json:"exists"`
	AllTables bool     `json:"all_tables"`
	Insert    bool     `json:"insert"`
	Update    bool     `json:"update"`
	Delete    bool     `json:"delete"`
	Truncate  bool     `json:"truncate"`
	Tables    []string `json:"tables"`
}

// Status is what `outboxd status` shows, read from PostgreSQL alone: the
// server, every replication slot, and the publication.
type Status struct {
	Database      string            `json:"database"`
	ServerVersion string            `json:"server_version"`
	InRecovery    bool              `json:"in_recovery"`
	CurrentWALLSN string            `json:"current_wal_lsn"`
	Slot          string            `json:"slot"`
	SlotFound     bool              `json:"slot_found"`
	Slots         []Listed          `json:"slots"`       // of this database
	OtherSlots    []Listed          `json:"other_slots"` // of other databases, and physical slots
	Publication   PublicationStatus `json:"publication"`
}

// ReadStatus reads the Status on an ordinary connection, with slotName
// marked Selected; a publication that does not exist is not an error.
func ReadStatus(ctx context.Context, conn *pgx.Conn, slotName, publication string) (*Status, error) {
	r := &Status{Slot: slotName, Slots: []Listed{}, OtherSlots: []Listed{}}
	// On a standby pg_current_wal_lsn() fails; the replay position is the
	// standby's "now".
	if err := conn.QueryRow(ctx, `SELECT current_database()::text, current_setting('server_version'), pg_is_in_recovery(),
		(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text`).
		Scan(&r.Database, &r.ServerVersion, &r.InRecovery, &r.CurrentWALLSN); err != nil {
		return nil, err
	}
	slots, err := List(ctx, conn.PgConn())
	if err != nil {
		return nil, err
	}
	for _, row := range slots {
		s := Listed{Slot: row, Selected: row.Name == slotName}
		r.SlotFound = r.SlotFound || s.Selected
		if s.Database == r.Database {
			r.Slots = append(r.Slots, s)
		} else {
			r.OtherSlots = append(r.OtherSlots, s)
		}
	}

	p := &r.Publication
	p.Name, p.Tables = publication, []string{}
	err = conn.QueryRow(ctx, `SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`,
		publication).Scan(&p.AllTables, &p.Insert, &p.Update, &p.Delete, &p.Truncate)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return r, nil
	case err != nil:
		return nil, err
	}
	p.Exists = true
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', schemaname, tablename) FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, publication)
	if err != nil {
		return nil, err
	}
	if p.Tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, err
	}
	return r, nil
}
