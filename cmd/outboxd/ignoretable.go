package main

import "strings"

// appendList is a repeatable flag that accumulates: --ignore-table a.b
// --ignore-table c.d, or comma-separated (the environment, the config file).
type appendList []string

func (l *appendList) String() string { return strings.Join(*l, ",") }

func (l *appendList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

const ignoreTableUsage = "publication table (schema.table) whose rows are not outbox events, repeatable: startup lets it pass instead of refusing it, and its changes are skipped (outboxd_events_skipped_total{reason=\"ignored_table\"}), e.g. the business tables of a FOR ALL TABLES publication shared with Debezium"
