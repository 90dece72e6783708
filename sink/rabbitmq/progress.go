package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/sink"
)

// ProgressStore keeps one slot's progress record (the gap check's memory,
// see sink.ProgressStore) as the only message of a durable queue of its own:
// x-max-length 1 with the default overflow (drop-head) makes the queue a
// last-value register, since publishing a new record drops the old one.
//
// Why a queue and not a stream: the record is read once at startup and
// written every few seconds; a queue is read with one basic.get (then
// requeued, so it stays; readers take turns, see LoadProgress), needs no plugin, no offset tracking and no
// retention policy, and RabbitMQ keeps it on disk like any durable queue.
// A stream would keep every record ever written until its retention
// removed them, and reading its last message takes a consumer and a scan.
//
// Its connection is its own, dialled on first use and again after an
// error, so the publisher's channel never waits on it.
type ProgressStore struct {
	URL     string
	TLS     *tls.Config
	Queue   string // e.g. "outboxd.progress.<slot>"
	Timeout time.Duration

	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
	// returns receives the channel's basic.returns: a mandatory record
	// that no queue took (the queue was deleted).
	returns  chan amqp.Return
	declared bool // the queue was declared on this connection
}

// NewProgressStore is the progress record of key (the slot) in the queue
// prefix.key, on the server of cfg.
func NewProgressStore(cfg Config, prefix, key string) *ProgressStore {
	return &ProgressStore{URL: cfg.URL, TLS: cfg.TLS, Queue: prefix + "." + key, Timeout: cfg.DialTimeout}
}

// progressArgs are the queue's arguments: one message, the newest.
var progressArgs = amqp.Table{"x-max-length": int32(1), "x-queue-type": "classic"}

// channel returns the store's channel, dialling if need be.
func (p *ProgressStore) channel() (*amqp.Channel, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	p.reset()
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	conn, err := dial(p.URL, p.TLS, timeout, progressConnName)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("rabbitmq: progress channel: %w", err)
	}
	p.conn, p.ch = conn, ch
	// RabbitMQ sends a basic.return before the confirm of the message it
	// returns, and the library hands it over before it handles the
	// confirm: once a write's confirm is in, its return is here.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 1))
	return ch, nil
}

func (p *ProgressStore) reset() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch, p.returns, p.declared = nil, nil, nil, false
}

// do runs f on the store's channel; an error drops the connection, so the
// next call starts on a fresh one.
func (p *ProgressStore) do(ctx context.Context, f func(*amqp.Channel) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	ch, err := p.channel()
	if err != nil {
		return err
	}
	// The library's synchronous calls take no context: closing the
	// connection is what unblocks them when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = p.conn.Close() })
	err = f(ch)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		p.reset()
	}
	return err
}

// EnsureProgressTopic declares the progress queue if it is missing.
func (p *ProgressStore) EnsureProgressTopic(ctx context.Context) error {
	err := p.do(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(p.Queue, true, false, false, false, progressArgs)
		return err
	})
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			return fmt.Errorf("rabbitmq: progress queue %s exists with other arguments than outboxd's (durable, x-max-length 1, classic): delete it (outboxd writes it again) or name another: %w", p.Queue, err)
		}
		return fmt.Errorf("rabbitmq: declare progress queue %s: %w", p.Queue, err)
	}
	return nil
}

// LoadProgress returns the queue's one message (nil: none yet). It takes
// the message without acknowledging it and gives it back (basic.nack with
// requeue), so it stays for the next reader.
//
// While one reader holds the message, the queue looks empty to another
// one's basic.get, and "empty" would load as "nothing published yet": a
// standby that reloads then creates a new slot past undelivered events. So
// readers take turns: each holds the store's read lock (see lock) from its
// basic.get until the message is back in the queue.
func (p *ProgressStore) LoadProgress(ctx context.Context) ([]byte, error) {
	var out []byte
	err := p.do(ctx, func(ch *amqp.Channel) error {
		unlock, err := p.lock(ctx)
		if err != nil {
			return err
		}
		d, ok, err := ch.Get(p.Queue, false)
		if err == nil && ok {
			out = append([]byte{}, d.Body...)
			if err = d.Nack(false, true); err == nil {
				// basic.nack has no answer: a synchronous call to the
				// queue on the same channel returns only once the queue
				// has processed it, so the message is back before the
				// lock is released.
				_, err = ch.QueueDeclarePassive(p.Queue, true, false, false, false, nil)
			}
		}
		if uerr := unlock(); err == nil {
			err = uerr
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: read progress queue %s: %w", p.Queue, err)
	}
	return out, nil
}

// lockSuffix names the read lock's queue: <progress queue>.read-lock.
const lockSuffix = ".read-lock"

// lock takes the store's read lock: an exclusive queue of that name, which
// only one connection at a time can declare (another gets 405
// RESOURCE_LOCKED, and retries until ctx ends), and which the server
// deletes with the connection, so a reader that dies holding the lock
// releases it. unlock deletes it. Called from do, on its connection.
func (p *ProgressStore) lock(ctx context.Context) (unlock func() error, err error) {
	name := p.Queue + lockSuffix
	wait := 5 * time.Millisecond
	for {
		ch, err := p.conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("read lock %s: %w", name, err)
		}
		_, err = ch.QueueDeclare(name, false, false, true, false, nil)
		if err == nil {
			return func() error {
				_, err := ch.QueueDelete(name, false, false, false)
				if err == nil {
					err = ch.Close()
				}
				return err
			}, nil
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked {
			_ = ch.Close()
			return nil, fmt.Errorf("read lock %s: %w", name, err)
		}
		// The server closed the channel: another reader holds the lock.
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read lock %s: another reader holds it: %w", name, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// WriteProgress publishes value to the queue (through the default
// exchange) and waits for the confirm: the queue's length limit drops the
// record it replaces.
//
// The slot's confirmation waits for this write (the record caps it), so a
// write is one round trip: the queue is declared once per connection, not
// before every write, and the record is mandatory, so a queue deleted since
// comes back as a basic.return, not as a record silently dropped; the
// write then declares the queue again and publishes once more.
func (p *ProgressStore) WriteProgress(ctx context.Context, value []byte) error {
	err := p.do(ctx, func(ch *amqp.Channel) error {
		for attempt := 0; ; attempt++ {
			if !p.declared {
				if _, err := ch.QueueDeclare(p.Queue, true, false, false, false, progressArgs); err != nil {
					return err
				}
				p.declared = true
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", p.Queue, true, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: value, Timestamp: time.Now()})
			if err != nil {
				return err
			}
			ok, err := dc.WaitContext(ctx)
			if err == nil && !ok {
				err = errors.New("nacked by the server")
			}
			if err != nil {
				return err
			}
			select {
			case r := <-p.returns:
				p.declared = false
				if attempt > 0 {
					return fmt.Errorf("returned by the server (%d %s) twice: the queue is deleted as soon as it is declared", r.ReplyCode, r.ReplyText)
				}
			default:
				return nil
			}
		}
	})
	if err != nil {
		return fmt.Errorf("rabbitmq: write progress record to queue %s: %w", p.Queue, err)
	}
	return nil
}

// String names the record, for logs and errors.
func (p *ProgressStore) String() string { return "queue " + p.Queue }

// Close closes the store's connection.
func (p *ProgressStore) Close() {
	p.mu.Lock()
	p.reset()
	p.mu.Unlock()
}

var _ sink.ProgressStore = (*ProgressStore)(nil)
