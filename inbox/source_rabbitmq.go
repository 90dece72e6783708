package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// rabbitKeyHeader is where outboxd's RabbitMQ sink puts the record key
// (sink/rabbitmq.KeyHeader).
const rabbitKeyHeader = "outboxd.key"

// rabbitSource consumes RabbitMQ queues with manual acks, sent only after
// the database commit, and basic.qos prefetch.
//
// Order. A queue delivers to one consumer in queue order, and a message
// that goes back (its channel closed before the ack) is requeued at its
// original position. Two consumers of one queue would split it between them
// and reorder each aggregate, so each queue is consumed with an exclusive
// basic.consume: one consumer at a time; another process of the same
// service stands by and retries until the first one's channel closes, then
// gets the unacknowledged messages first, in order. A classic queue does
// both in its own process, one after the other. A quorum queue does not:
// its exclusivity check can let a new consumer in before the dead one's
// messages are returned, which then come after newer ones; a quorum queue
// needs x-single-active-consumer, whose activation of the next consumer is
// one step with the return (a classic queue with it refuses exclusive
// consumers: the inbox then consumes non-exclusively and lets the queue
// keep one active). A lane lives
// as long as its channel: when the channel closes, the lane finishes its
// current batch and drops the rest of its queue, which RabbitMQ redelivers.
type rabbitSource struct {
	c *Consumer
}

func (r *rabbitSource) run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, q := range r.c.cfg.Topics {
		wg.Go(func() { r.consume(ctx, q) })
	}
	wg.Wait()
	r.c.stopAllLanes()
	return nil
}

func (r *rabbitSource) consume(ctx context.Context, queue string) {
	for ctx.Err() == nil {
		err := r.own(ctx, queue)
		if err != nil && ctx.Err() == nil {
			r.c.log.Warn("inbox: consuming the queue stopped; starting over", "queue", queue, "error", err)
			_ = sleepCtx(ctx, time.Second)
		}
	}
}

// own connects, consumes queue exclusively until ctx ends or the channel
// closes, and closes the connection.
func (r *rabbitSource) own(ctx context.Context, queue string) error {
	c := r.c
	conn, err := amqp.DialConfig(c.cfg.Broker, amqp.Config{TLSClientConfig: c.cfg.AMQPTLS, Heartbeat: 10 * time.Second,
		Properties: amqp.Table{"connection_name": "outboxd-inbox " + c.cfg.Name}})
	if err != nil {
		return fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	defer conn.Close()
	var deliveries <-chan amqp.Delivery
	for waited := false; ; {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("opening a channel: %w", err)
		}
		if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
			return fmt.Errorf("basic.qos prefetch %d: %w", c.cfg.Prefetch, err)
		}
		deliveries, err = ch.Consume(queue, consumerTag(c.cfg.Group, queue), false, true, false, false, nil)
		if err == nil {
			break
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			return fmt.Errorf("consuming queue %s: %w (fix: declare the queue and bind it to outboxd's exchange)", queue, err)
		}
		// Refused: another consumer has the queue, or the queue is a
		// single-active-consumer one (a classic one refuses exclusive
		// consumers), which keeps one consumer active by itself.
		if deliveries, err = r.consumeSAC(conn, queue); err != nil {
			return err
		}
		if deliveries != nil {
			break
		}
		// Another consumer has the queue: stand by.
		if !waited {
			c.log.Info("inbox: another consumer has the queue (exclusive); standing by until it stops", "queue", queue)
			waited = true
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return nil
		}
	}
	k := tp{queue, 0}
	lane := c.openLane(queue, 0, func(ev *Event) {
		if err := ev.src.(amqp.Delivery).Ack(false); err != nil {
			c.log.Warn("inbox: RabbitMQ ack failed after the commit; the event comes again as a duplicate", "queue", queue, "error", err)
		}
	}, laneOpts{})
	defer c.stopLanes([]tp{k})
	c.log.Info("inbox: consuming the queue (exclusive consumer)", "queue", queue, "prefetch", c.cfg.Prefetch)
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("the channel closed (connection lost or the queue deleted); its unacknowledged messages are requeued")
			}
			evs := []*Event{rabbitEvent(queue, d)}
			// Hand over everything already delivered in one push.
			for more := true; more && len(evs) < c.cfg.Prefetch; {
				select {
				case d, ok := <-deliveries:
					if !ok {
						more = false
						break
					}
					evs = append(evs, rabbitEvent(queue, d))
				default:
					more = false
				}
			}
			lane.push(evs, 0)
		}
	}
}

// consumeSAC consumes queue non-exclusively if nobody consumes it, which
// means that its exclusive consume was refused because it is a
// single-active-consumer queue; nil deliveries: somebody consumes it.
func (r *rabbitSource) consumeSAC(conn *amqp.Connection, queue string) (<-chan amqp.Delivery, error) {
	c := r.c
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a channel: %w", err)
	}
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("looking up queue %s: %w", queue, err)
	}
	if q.Consumers > 0 {
		_ = ch.Close()
		return nil, nil
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("basic.qos prefetch %d: %w", c.cfg.Prefetch, err)
	}
	d, err := ch.Consume(queue, consumerTag(c.cfg.Group, queue), false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consuming queue %s: %w", queue, err)
	}
	c.log.Info("inbox: the queue refuses exclusive consumers (x-single-active-consumer): consuming it as one of its consumers, it keeps one active", "queue", queue)
	return d, nil
}

func consumerTag(group, queue string) string {
	if group == "" {
		return ""
	}
	return fmt.Sprintf("%s/%s", group, queue)
}

func rabbitEvent(queue string, d amqp.Delivery) *Event {
	ev := &Event{Value: d.Body, Topic: queue, Offset: int64(d.DeliveryTag), Timestamp: d.Timestamp, src: d}
	for k, v := range d.Headers {
		var b []byte
		switch v := v.(type) {
		case string:
			b = []byte(v)
		case []byte:
			b = v
		default:
			b = fmt.Append(nil, v)
		}
		ev.Headers = append(ev.Headers, kgo.RecordHeader{Key: k, Value: b})
		if k == rabbitKeyHeader {
			ev.Key = b
		}
	}
	fillIDs(ev)
	readCloudEvent(ev, ceAMQP, d.ContentType)
	if ev.ID == "" {
		ev.ID = d.MessageId
	}
	if ev.Type == "" {
		ev.Type = d.Type
	}
	return ev
}
