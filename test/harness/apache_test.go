package harness

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A 3-node cluster: every node registered, topics default to RF 3 with
// min.insync.replicas 2, the quorum survives the kill of its leader, and a
// killed node rejoins.
func TestApacheCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three JVMs (-short)")
	}
	ctx := testCtx(t, 5*time.Minute)
	start := time.Now()
	c := ApacheKafkaForTest(t, 3)
	t.Logf("3-node Apache Kafka %s ready in %v", c.Version(), time.Since(start).Round(10*time.Millisecond))

	opts, err := c.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 3, -1, nil, "rf"); err != nil {
		t.Fatal(err)
	}
	md, err := adm.Metadata(ctx, "rf")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(md.Brokers); n != 3 {
		t.Fatalf("%d brokers in metadata, want 3", n)
	}
	for _, p := range md.Topics["rf"].Partitions {
		if len(p.Replicas) != 3 {
			t.Fatalf("partition %d has replicas %v, want 3", p.Partition, p.Replicas)
		}
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, "rf")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := cfgs.On("rf", nil); err != nil || configValue(v.Configs, "min.insync.replicas") != "2" {
		t.Fatalf("min.insync.replicas %q (%v), want 2", configValue(v.Configs, "min.insync.replicas"), err)
	}

	ctrl, err := c.ActiveController(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrl.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		next, err := c.ActiveController(ctx)
		if err == nil && next.ID != ctrl.ID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new active controller after killing node %d: %v", ctrl.ID, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rs := time.Now()
	if err := ctrl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d restarted and registered in %v", ctrl.ID, time.Since(rs).Round(10*time.Millisecond))
	leader, err := c.Leader(ctx, "rf", 0)
	if err != nil {
		t.Fatal(err)
	}
	ss := time.Now()
	if err := leader.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("clean stop of partition leader %d took %v", leader.ID, time.Since(ss).Round(10*time.Millisecond))
}

func configValue(cs []kadm.Config, key string) string {
	for _, c := range cs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}
