// Package sysid names a slot across clusters: the PostgreSQL system
// identifier qualifies the slot name in the keys of the checkpoint and
// progress records, so that instances of different clusters sharing a topic
// (and slot names) never read each other's.
package sysid

import (
	"context"

	"github.com/outboxd/outboxd/wal"
)

// Key is "<system id>/<slot>", the key of this slot's checkpoint and
// progress records.
func Key(ctx context.Context, dsn, slotName string) (string, error) {
	sys, err := Identify(ctx, dsn)
	if err != nil {
		return "", err
	}
	return sys.ID + "/" + slotName, nil
}

// Identify asks the server for its system identifier and WAL position over
// a short-lived replication connection (outboxd's role always may open one).
func Identify(ctx context.Context, dsn string) (wal.System, error) {
	conn, err := wal.Connect(ctx, dsn)
	if err != nil {
		return wal.System{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return wal.Identify(ctx, conn)
}
