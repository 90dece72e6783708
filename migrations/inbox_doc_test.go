package migrations

import (
	"os"
	"strings"
	"testing"
)

// docs/inbox.md prints the inbox tables' SQL for consumers outside this
// module; it must be what InboxTables returns, so the page cannot drift
// from the tables the package expects.
func TestInboxSQLInDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/inbox.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i, j := strings.Index(text, "<!-- inbox-sql:begin"), strings.Index(text, "<!-- inbox-sql:end -->")
	if i < 0 || j < i {
		t.Fatal("docs/inbox.md has no inbox-sql:begin … inbox-sql:end block")
	}
	block := text[i:j]
	start := strings.Index(block, "```sql\n")
	end := strings.LastIndex(block, "```")
	if start < 0 || end <= start {
		t.Fatal("the inbox-sql block has no ```sql fence")
	}
	have := block[start+len("```sql\n") : end]
	want, err := InboxTables("public")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(have) != strings.TrimSpace(want) {
		t.Errorf("docs/inbox.md's SQL differs from InboxTables(\"public\"):\n--- docs\n%s\n--- InboxTables\n%s", have, want)
	}
}
