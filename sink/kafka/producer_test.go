package kafka

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// README and docs/configuration.md: the producer is idempotent with acks=all, in both delivery modes
// (read back from the client as built, without a broker).
func TestProducerIdempotentAcksAll(t *testing.T) {
	for _, txn := range []*Transactional{nil, {ID: TransactionalID(DefaultTransactionalIDPrefix, "7212345678901234567", "s"), Timeout: time.Minute}} {
		s, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Transactional: txn})
		if err != nil {
			t.Fatal(err)
		}
		cl := s.cl()
		if got := cl.OptValue(kgo.RequiredAcks); got != kgo.AllISRAcks() {
			t.Errorf("transactional=%v: RequiredAcks %v, want AllISRAcks (acks=all)", txn != nil, got)
		}
		if got := cl.OptValue(kgo.DisableIdempotentWrite); got != false {
			t.Errorf("transactional=%v: DisableIdempotentWrite %v, want false (idempotent)", txn != nil, got)
		}
		if txn != nil {
			if got := cl.OptValue(kgo.TransactionalID); got != "outboxd.7212345678901234567.s" {
				t.Errorf("TransactionalID %v, want outboxd.7212345678901234567.s", got)
			}
		}
		cl.Close()
	}
}
