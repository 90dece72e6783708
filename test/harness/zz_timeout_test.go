package harness

import (
	"testing"
	"time"
)

func TestZZTimeout(t *testing.T) {
	PostgresForTest(t)
	KafkaForTest(t)
	time.Sleep(time.Minute)
}
