package backoff

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := Backoff{Min: time.Second, Max: 5 * time.Second}
		var got []time.Duration
		for range 5 {
			start := time.Now()
			if !b.Wait(context.Background()) {
				t.Fatal("Wait returned false without a cancel")
			}
			got = append(got, time.Since(start))
		}
		want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("steps %v, want %v", got, want)
			}
		}
		b.Reset()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if b.Wait(ctx) {
			t.Fatal("Wait after cancel returned true")
		}
	})
}
