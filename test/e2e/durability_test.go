package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outboxd/outboxd/test/harness"
)

// A topic that can lose what it acknowledged (unclean.leader.election.enable
// =true) is named once, on /status's durability_warnings and in the log at
// WARN, once its first event went out; the topic outboxd creates with the
// broker's defaults (one node: replication factor 1; the three-node
// cluster: 3 with min.insync.replicas 2) is checked and not named (issue 31
// item 7). Apache Kafka only: kfake has no unclean leader election config.
func TestKafkaDurabilityWarning(t *testing.T) {
	if kind := sharedKafka.Kind(); kind != harness.KindApache && kind != harness.KindApacheCluster {
		t.Skipf("needs Apache Kafka (kfake has no unclean.leader.election.enable): %s=%s", harness.EnvKafkaKind, harness.KindApache)
	}
	f := newFixture(t)
	unclean := f.agg + "Unclean"
	unsafe := "outbox.event." + unclean
	if _, err := f.admin().CreateTopic(f.ctx, 1, -1, map[string]*string{"unclean.leader.election.enable": kadm.StringPtr("true")}, unsafe); err != nil {
		t.Fatal(err)
	}
	r := f.startRelay()
	if _, err := f.conn.Exec(f.ctx, insertSQL, eventID(1), unclean, "k", "E", `{"n": 1}`); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.commit(event{2, "k", "E", `{"n": 2}`}), 60*time.Second)
	for _, topic := range []string{unsafe, f.topic()} {
		poll(t, 30*time.Second, "the check of "+topic+" in the log", func() bool {
			return strings.Contains(r.Log(), `msg="kafka: checked the topic's durability settings" topic=`+topic+" ")
		})
	}
	st, err := harness.Status(f.ctx, r.http)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("topic %s: topic %s has unclean.leader.election.enable=true", unsafe, unsafe)
	if list, _ := st["durability_warnings"].([]any); len(list) != 1 || !strings.HasPrefix(fmt.Sprint(list[0]), want) {
		t.Fatalf("/status durability_warnings %v, want only %q…", st["durability_warnings"], want)
	}
	if n := strings.Count(r.Log(), `destination="topic `+unsafe+`"`); n != 1 || strings.Contains(r.Log(), `destination="topic `+f.topic()+`"`) {
		t.Fatalf("warnings in the log: %d for %s (want 1), and %s named: %v\n%s", n, unsafe, f.topic(), strings.Contains(r.Log(), `destination="topic `+f.topic()+`"`), r.Log())
	}
}
