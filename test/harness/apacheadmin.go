package harness

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Cluster queries the fault suites aim their faults with.

// admin runs fn with an admin client on the running, unpaused nodes.
func (c *ApacheKafka) admin(ctx context.Context, fn func(*kadm.Client, *kgo.Client) error) error {
	var up []*ApacheNode
	for _, nd := range c.nodes {
		if nd.Running() && !nd.Paused() {
			up = append(up, nd)
		}
	}
	if len(up) == 0 {
		return errors.New("apache kafka: no node running")
	}
	opts, err := c.adminOpts(up...)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return fn(kadm.NewClient(cl), cl)
}

// Leader returns the node leading topic's partition.
func (c *ApacheKafka) Leader(ctx context.Context, topic string, partition int32) (*ApacheNode, error) {
	var leader int32 = -1
	err := c.admin(ctx, func(adm *kadm.Client, _ *kgo.Client) error {
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			return err
		}
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil {
			return fmt.Errorf("topic %s: %v", topic, td.Err)
		}
		p, ok := td.Partitions[partition]
		if !ok || p.Err != nil {
			return fmt.Errorf("topic %s partition %d: %v", topic, partition, p.Err)
		}
		leader = p.Leader
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("apache kafka: leader of %s/%d: %w", topic, partition, err)
	}
	if nd := c.Node(leader); nd != nil {
		return nd, nil
	}
	return nil, fmt.Errorf("apache kafka: %s/%d has no leader (%d)", topic, partition, leader)
}

// ActiveController returns the node leading the KRaft quorum.
func (c *ApacheKafka) ActiveController(ctx context.Context) (*ApacheNode, error) {
	var leader int32 = -1
	err := c.admin(ctx, func(_ *kadm.Client, cl *kgo.Client) error {
		req := kmsg.NewPtrDescribeQuorumRequest()
		t := kmsg.NewDescribeQuorumRequestTopic()
		t.Topic = "__cluster_metadata"
		p := kmsg.NewDescribeQuorumRequestTopicPartition()
		t.Partitions = append(t.Partitions, p)
		req.Topics = append(req.Topics, t)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		if len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
			return errors.New("empty DescribeQuorum response")
		}
		leader = resp.Topics[0].Partitions[0].LeaderID
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("apache kafka: active controller: %w", err)
	}
	if nd := c.Node(leader); nd != nil {
		return nd, nil
	}
	return nil, fmt.Errorf("apache kafka: no active controller (%d)", leader)
}

// TxnCoordinator returns the node coordinating transactionalID.
func (c *ApacheKafka) TxnCoordinator(ctx context.Context, transactionalID string) (*ApacheNode, error) {
	var id int32 = -1
	err := c.admin(ctx, func(adm *kadm.Client, _ *kgo.Client) error {
		resp := adm.FindTxnCoordinators(ctx, transactionalID)
		r, ok := resp[transactionalID]
		if !ok || r.Err != nil {
			return fmt.Errorf("coordinator of %s: %v", transactionalID, r.Err)
		}
		id = r.NodeID
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("apache kafka: %w", err)
	}
	if nd := c.Node(id); nd != nil {
		return nd, nil
	}
	return nil, fmt.Errorf("apache kafka: no transaction coordinator for %s (%d)", transactionalID, id)
}
