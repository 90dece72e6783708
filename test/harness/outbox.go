package harness

import (
	"fmt"

	"github.com/outboxd/outboxd/migrations"
)

// OutboxSchema is the SQL `outboxd setup` runs, rendered from the
// migrations package so that the tests run on the DDL users get: the outbox
// table public.outbox in Debezium's layout (001) and publication for it
// (003, publish = 'insert'). publish, if not "insert", then sets what the
// publication publishes (a test of UPDATEs or DELETEs reaching outboxd).
// The statements run in one simple-protocol Exec.
func OutboxSchema(publication, publish string) (string, error) {
	vars := migrations.Vars{Table: "public.outbox", Schema: "public", Publication: publication}
	table, err := migrations.Render(migrations.OutboxTable, vars)
	if err != nil {
		return "", err
	}
	pub, err := migrations.Render(migrations.Publication, vars)
	if err != nil {
		return "", err
	}
	sql := table + pub
	if publish != "" && publish != "insert" {
		sql += fmt.Sprintf("\nALTER PUBLICATION %s SET (publish = '%s');\n", publication, publish)
	}
	return sql, nil
}
