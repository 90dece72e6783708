package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A FOR ALL TABLES publication (Debezium's publication.autocreate.mode =
// all_tables, reused at a cutover) publishes business tables too. outboxd
// checks the publication's tables against the router before streaming and
// refuses the ones it cannot route, naming them and the fix, instead of
// stopping at the first business row with the slot held before it.
func TestPublicationTablesCheckedAtStartup(t *testing.T) {
	f := newFixture(t)
	f.exec(`CREATE TABLE orders (id int PRIMARY KEY, total numeric)`)
	f.exec(`DROP PUBLICATION outboxd`)
	f.exec(`CREATE PUBLICATION outboxd FOR ALL TABLES WITH (publish = 'insert')`)
	f.asSetupRole()
	p, _ := f.spawn()
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	code, err := p.Wait(ctx)
	if err != nil || code != 1 || !strings.Contains(p.Log(), `publication "outboxd" publishes 1 table(s) whose rows outboxd cannot route`) ||
		!strings.Contains(p.Log(), `public.orders: no column "payload"`) || strings.Contains(p.Log(), "public.outbox:") {
		t.Fatalf("exit %d, err %v; want exit 1 naming public.orders (and not public.outbox)\n%s", code, err, tailString(p.Log(), 3000))
	}
	var n int
	if err := f.conn.QueryRow(f.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d slots (err %v): refused before creating one", n, err)
	}
}
