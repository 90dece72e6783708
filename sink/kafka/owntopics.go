package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ensureOwnTopic makes sure one of outboxd's own topics (the exactly-once
// checkpoint topic, the progress topic: compacted, one partition) exists,
// following --create-topics like every other topic: with it, the topic is
// created through the admin API; without it, a missing topic is an error
// naming the command that creates it (a *TopicHoldError), which the callers
// wait out, looking again, as they wait for Kafka. The broker's
// auto-creation is never asked for here: it would make the topic with the
// broker's defaults (delete policy, num.partitions), and a deleted
// checkpoint or a second partition breaks what the topic is for.
func (s *Sink) ensureOwnTopic(ctx context.Context, topic, what string) error {
	if s.topics.cfg.Create {
		resp, err := kadm.NewClient(s.cl()).CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": ptr("compact")}, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafka: create %s topic %s: %w", what, topic, err)
		}
		return nil
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, s.cl())
	if err != nil {
		return fmt.Errorf("kafka: metadata for the %s topic %s: %w", what, topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("kafka: metadata for the %s topic %s: %d topics in the response", what, topic, len(resp.Topics))
	}
	switch err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); {
	case err == nil:
		return nil
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return &TopicHoldError{Topic: topic, Reason: "--create-topics is false, so outboxd does not create its " + what + " topic",
			Fix: fmt.Sprintf("create it: kafka-topics.sh --bootstrap-server %s --create --topic %s --partitions 1 --config cleanup.policy=compact (or run outboxd with --create-topics)",
				s.topics.bootstrap(), topic)}
	default:
		return fmt.Errorf("kafka: metadata for the %s topic %s: %w", what, topic, err)
	}
}
