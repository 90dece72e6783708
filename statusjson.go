package outboxd

import (
	"encoding/json"
	"time"
)

// MarshalJSON writes /status's slot_server_view in the schema of `outboxd
// status --json` (slot.Slot's JSON): the same snake_case keys, and null
// where PostgreSQL has no value (safe_wal_size_bytes with an unlimited
// max_slot_wal_keep_size, active_pid of an inactive slot, the
// confirmed_flush_lsn of a slot never confirmed) rather than -1, 0 or "".
// Two keys are its own: found, and polled_at (when the monitor read it).
func (v slotView) MarshalJSON() ([]byte, error) {
	var pid *int
	if v.ActivePID != 0 {
		pid = &v.ActivePID
	}
	var confirmed *string
	if v.ConfirmedFlush != "" {
		confirmed = &v.ConfirmedFlush
	}
	var safe *int64
	if v.SafeWALSize >= 0 {
		safe = &v.SafeWALSize
	}
	var at *string
	if !v.At.IsZero() {
		s := v.At.UTC().Format(time.RFC3339Nano)
		at = &s
	}
	return json.Marshal(struct {
		Found          bool    `json:"found"`
		Plugin         string  `json:"plugin"`
		Active         bool    `json:"active"`
		ActivePID      *int    `json:"active_pid"`
		ConfirmedFlush *string `json:"confirmed_flush_lsn"`
		LagBytes       int64   `json:"lag_bytes"`
		RetainedBytes  int64   `json:"retained_wal_bytes"`
		WALStatus      string  `json:"wal_status"`
		SafeWALSize    *int64  `json:"safe_wal_size_bytes"`
		Failover       bool    `json:"failover"`
		Synced         bool    `json:"synced"`
		PolledAt       *string `json:"polled_at"`
	}{v.Found, v.Plugin, v.Active, pid, confirmed, v.LagBytes, v.RetainedBytes, v.WALStatus, safe, v.Failover, v.Synced, at})
}
