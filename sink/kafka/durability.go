package kafka

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Durability. With acks=all a produce is acknowledged once every replica in
// the partition's ISR has the record; min.insync.replicas is how small the
// ISR may shrink before the leader refuses produces instead. At 1, the ISR
// can be the leader alone, so an ack can mean one broker's page cache, lost
// with that broker. unclean.leader.election.enable lets a replica that is
// not in the ISR (missing acknowledged records) become leader: the records
// it lacks are truncated away everywhere. outboxd confirms the slot on the
// ack, so either loss is permanent once PostgreSQL recycles the WAL.

// TopicRisks says why topic, with replication factor rf and configs cfg
// (as DescribeConfigs returns them: the topic's own, else the broker's),
// can lose records it acknowledged: unclean leader election on, or fewer
// than 2 in-sync replicas required where there are 3 or more replicas (with
// fewer, min.insync.replicas 2 would stop producing at the first broker
// down, so a replication factor of 1 or 2 is the operator's informed
// choice).
func TopicRisks(topic string, rf int, cfg map[string]string) []string {
	var out []string
	if cfg["unclean.leader.election.enable"] == "true" {
		out = append(out, fmt.Sprintf("topic %s has unclean.leader.election.enable=true: a replica missing acknowledged records can become leader and they are truncated away; "+
			"kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config unclean.leader.election.enable=false", topic, topic))
	}
	if isr, err := strconv.Atoi(cfg["min.insync.replicas"]); err == nil && rf >= 3 && isr < 2 {
		out = append(out, fmt.Sprintf("topic %s has min.insync.replicas=%d with %d replicas: an ack can mean the leader alone has the record, lost with that broker; "+
			"kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config min.insync.replicas=2", topic, isr, rf, topic))
	}
	return out
}

// checkDurability reads topic's replication factor (the smallest of its
// partitions') and configs, and tells TopicConfig.Durability what can lose
// acknowledged records. It runs once per topic, when the topic is first
// found usable; a failure (no DescribeConfigs permission, a broker down)
// is logged at info, as nothing was found.
func (t *topics) checkDurability(topic string) {
	ctx, cancel := context.WithTimeout(t.ctx, 30*time.Second)
	defer cancel()
	rf, cfg, err := describeDurability(ctx, kadm.NewClient(t.client()), topic)
	if err != nil {
		if t.ctx.Err() == nil {
			t.log.Info("kafka: could not read the topic's replication factor and configs to check that it keeps what it acknowledged", "topic", topic, "err", err)
		}
		return
	}
	for _, why := range TopicRisks(topic, rf, cfg) {
		t.cfg.Durability("topic "+topic, why)
	}
	t.log.Debug("kafka: checked the topic's durability settings", "topic", topic, "replication_factor", rf,
		"min_insync_replicas", cfg["min.insync.replicas"], "unclean_leader_election", cfg["unclean.leader.election.enable"])
}

func describeDurability(ctx context.Context, adm *kadm.Client, topic string) (int, map[string]string, error) {
	md, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, nil, err
	}
	td, ok := md[topic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		return 0, nil, fmt.Errorf("metadata for %s: %v", topic, td.Err)
	}
	rf := -1
	for _, p := range td.Partitions {
		if rf < 0 || len(p.Replicas) < rf {
			rf = len(p.Replicas)
		}
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, nil, err
	}
	rc, err := rcs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return 0, nil, err
	}
	cfg := map[string]string{}
	for _, c := range rc.Configs {
		if c.Value != nil {
			cfg[c.Key] = *c.Value
		}
	}
	return rf, cfg, nil
}
