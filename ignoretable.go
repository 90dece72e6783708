package outboxd

import (
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/wal"
)

// Tables the operator named with Config.IgnoreTables (--ignore-table): a
// publication may publish tables that are not outboxes (a FOR ALL TABLES
// publication shared with Debezium or another consumer). Without the
// option, such a table stops outboxd at startup with the table and the fix
// (slot.checkTables); with it, the table is neither checked nor published:
// its changes are skipped and counted (outboxd_events_skipped_total
// {reason="ignored_table"}), and the slot is confirmed past them like past
// any other change.

// validateIgnoreTables checks that each entry is "schema.table".
func validateIgnoreTables(tables []string) error {
	for _, t := range tables {
		ns, name, ok := strings.Cut(t, ".")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("outboxd: ignored table %q: want schema.table, as pg_publication_tables names it (e.g. public.orders)", t)
		}
	}
	return nil
}

// ignores reports whether rel is one of Config.IgnoreTables. Callers check
// len(c.IgnoreTables) first: the common case costs nothing per row.
func (c *Config) ignores(rel *wal.Relation) bool {
	if rel == nil {
		return false
	}
	for _, t := range c.IgnoreTables {
		if ns, name, _ := strings.Cut(t, "."); ns == rel.Namespace && name == rel.Name {
			return true
		}
	}
	return false
}

// unroutable is the startup check's question to the router, with the
// ignored tables let through.
func (r *relay) unroutable(rel *wal.Relation) string {
	if len(r.cfg.IgnoreTables) > 0 && r.cfg.ignores(rel) {
		return ""
	}
	return r.router.Unroutable(rel)
}

// ignored reports (and counts) a row change of an ignored table.
func (s *streamer) ignored(msg *wal.Msg) bool {
	switch msg.Kind {
	case wal.KindInsert, wal.KindUpdate, wal.KindDelete:
		if s.cfg.ignores(msg.Row.Relation) {
			s.m.skipped.WithLabelValues("ignored_table").Inc()
			return true
		}
	}
	return false
}
