package e2e

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxd/outboxd/test/harness"
)

// A missing topic is created through the admin API before its first event,
// with the partitions, replication factor and configs given.
func TestCreatesMissingTopic(t *testing.T) {
	f := newFixture(t)
	f.startRelay("--topic-partitions", "2", "--topic-replication-factor", "1",
		"--topic-config", "retention.ms=3600000", "--topic-config", "max.message.bytes=2000000")
	end := f.commit(event{1, "a", "E", `{"n": 1}`}, event{2, "b", "E", `{"n": 2}`})
	f.waitConfirmed(end, 30*time.Second)
	if recs := f.records(); len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	md, err := f.admin().Metadata(f.ctx, f.topic())
	if err != nil {
		t.Fatal(err)
	}
	td := md.Topics[f.topic()]
	if len(td.Partitions) != 2 {
		t.Fatalf("topic has %d partitions, want 2", len(td.Partitions))
	}
	for _, p := range td.Partitions {
		if len(p.Replicas) != 1 {
			t.Fatalf("partition %d has replicas %v, want 1", p.Partition, p.Replicas)
		}
	}
	cfgs, err := f.admin().DescribeTopicConfigs(f.ctx, f.topic())
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cfgs.On(f.topic(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range rc.Configs {
		if c.Value != nil {
			got[c.Key] = *c.Value
		}
	}
	if got["retention.ms"] != "3600000" || got["max.message.bytes"] != "2000000" {
		t.Fatalf("topic configs retention.ms=%q max.message.bytes=%q, want 3600000 and 2000000", got["retention.ms"], got["max.message.bytes"])
	}
}

// With --create-topics=false and a broker that does not auto-create topics
// (production's setting), the event is held: nothing is confirmed past it,
// one error names the topic and the kafka-topics.sh command, /readyz says
// so; once the topic exists the event goes out and the slot moves on.
func TestMissingTopicHeld(t *testing.T) {
	k := harness.KafkaForTest(t, harness.WithoutAutoCreate())
	if k.External() {
		t.Skip("needs a broker that does not auto-create topics")
	}
	f := newFixture(t, withKafka(k))
	// outboxd's own progress topic follows the flag too: the operator
	// made it (compacted, one partition), as outboxd's error says.
	if _, err := f.admin().CreateTopic(f.ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, "outboxd.progress"); err != nil {
		t.Fatal(err)
	}
	r := f.startRelay("--create-topics=false")
	before := f.slotState().ConfirmedFlushLSN
	end := f.commit(event{1, "a", "E", `{"held": true}`})

	cmd := "kafka-topics.sh --bootstrap-server " + k.Brokers()[0] + " --create --topic " + f.topic()
	poll(t, 20*time.Second, "/readyz 503 naming the topic and the fix", func() bool {
		c, body := r.get(t, "/readyz")
		return c == 503 && strings.Contains(body, `"`+f.topic()+`"`) && strings.Contains(body, cmd)
	})
	// Held for several status intervals: never confirmed past the event.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if s := f.slotState(); s.ConfirmedFlushLSN >= end {
			t.Fatalf("confirmed_flush_lsn %s passed the held event (commit ends at %s; was %s)",
				harness.FormatLSN(s.ConfirmedFlushLSN), harness.FormatLSN(end), harness.FormatLSN(before))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := strings.Count(r.Log(), "kafka topic missing"); n != 1 {
		t.Fatalf("%d 'kafka topic missing' errors in the log, want exactly 1\n%s", n, r.Log())
	}

	// The operator runs the fix (here through the admin API).
	resp, err := f.admin().CreateTopic(f.ctx, -1, -1, nil, f.topic())
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatal(err)
	}
	f.waitConfirmed(end, 30*time.Second)
	recs := f.records()
	if len(recs) != 1 || string(recs[0].Value) != `{"held": true}` {
		t.Fatalf("records %v, want the held event", recs)
	}
	poll(t, 20*time.Second, "/readyz 200 once the topic exists", func() bool { c, _ := r.get(t, "/readyz"); return c == 200 })
	if n := strings.Count(r.Log(), "kafka topic missing"); n != 1 {
		t.Fatalf("%d 'kafka topic missing' errors in the log, want exactly 1", n)
	}
}

// kcatReadCommitted reads the test topic with kcat (librdkafka) as a
// read_committed consumer and returns the id header of each record.
func (f *fixture) kcatReadCommitted() []string {
	f.t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		f.t.Fatal("kcat not installed (apt-get install kcat; .ci/run installs it)")
	}
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kcat, "-C", "-b", strings.Join(f.kafka.Brokers(), ","), "-t", f.topic(),
		"-X", "isolation.level=read_committed", "-o", "beginning", "-e", "-q", "-f", `%h\n`).CombinedOutput()
	if err != nil {
		f.t.Fatalf("kcat: %v\n%s", err, out)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		for _, h := range strings.Split(line, ",") {
			if id, ok := strings.CutPrefix(h, "id="); ok {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// A principal without the CREATE ACL: the event is held with the
// kafka-acls.sh grant in /readyz, and granting CREATE releases it.
func TestTopicCreationDeniedByACL(t *testing.T) {
	if kind, _ := harness.KafkaKind(); kind != harness.KindApache && kind != harness.KindApacheCluster {
		t.Skip("ACLs need Apache Kafka's authorizer: runs in make test's OUTBOXD_TEST_KAFKA_KIND=apache run")
	}
	k := harness.KafkaForTest(t, harness.WithSASL("PLAIN", "admin", "admin-secret"), harness.WithACLUser("relay", "relay-secret"))
	f := newFixture(t, withKafka(k))
	grant := func(b *kadm.ACLBuilder) {
		t.Helper()
		res, err := f.admin().CreateACLs(f.ctx, b)
		if err == nil {
			for _, r := range res {
				if r.Err != nil {
					err = r.Err
				}
			}
		}
		if err != nil {
			t.Fatalf("creating ACLs: %v", err)
		}
	}
	// relay may write to and describe outbox topics, not create them.
	grant(kadm.NewACLs().Allow("User:relay").Topics("outbox.").ResourcePatternType(kadm.ACLPatternPrefixed).
		Operations(kadm.OpWrite, kadm.OpDescribe))
	grant(kadm.NewACLs().Allow("User:relay").Clusters().Operations(kadm.OpIdempotentWrite))
	// ... and keep its progress record (--progress-topic), as deploy/README asks.
	grant(kadm.NewACLs().Allow("User:relay").Topics("outboxd.progress").
		Operations(kadm.OpCreate, kadm.OpWrite, kadm.OpRead, kadm.OpDescribe))

	f.env = []string{"OUTBOXD_KAFKA_SASL_PASSWORD=relay-secret"}
	// PLAIN over loopback without TLS: the test broker has no TLS listener.
	r := f.startRelay("--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "relay", "--kafka-sasl-plain-allow-cleartext")
	end := f.commit(event{1, "a", "E", `{"acl": true}`})
	poll(t, 30*time.Second, "/readyz 503 naming the topic and the grant", func() bool {
		c, body := r.get(t, "/readyz")
		return c == 503 && strings.Contains(body, `"`+f.topic()+`"`) && strings.Contains(body, "may not create topics") &&
			strings.Contains(body, "kafka-acls.sh") && strings.Contains(body, "--operation Create")
	})
	if s := f.slotState(); s.ConfirmedFlushLSN >= end {
		t.Fatalf("confirmed_flush_lsn %s passed the held event (ends at %s)", harness.FormatLSN(s.ConfirmedFlushLSN), harness.FormatLSN(end))
	}
	grant(kadm.NewACLs().Allow("User:relay").Topics("outbox.").ResourcePatternType(kadm.ACLPatternPrefixed).Operations(kadm.OpCreate))
	f.waitConfirmed(end, 30*time.Second)
	if recs := f.records(); len(recs) != 1 || string(recs[0].Value) != `{"acl": true}` {
		t.Fatalf("records %v, want the held event", recs)
	}
	if n := strings.Count(r.Log(), "kafka topic missing"); n != 1 {
		t.Fatalf("%d 'kafka topic missing' errors in the log, want exactly 1", n)
	}
}
