package bench

import (
	"testing"
	"time"
)

// TestTracingRows: the tracing case's verdict is PASS or FAIL against +5%
// only when identical runs agree to within twice that; a traced run that
// lost spans is an error, not a measurement.
func TestTracingRows(t *testing.T) {
	run := func(cpuUS int, err error) TracingRun {
		return TracingRun{LatencyRun: LatencyRun{Sent: 1000, OutboxdCPU: time.Duration(cpuUS) * 1000 * time.Microsecond, P99: 10 * time.Millisecond}, Err: err}
	}
	for _, c := range []struct {
		off, on []int
		ratio   string
		result  string
	}{
		{[]int{36, 36}, []int{37, 37}, "+2.8%", "PASS"},
		{[]int{36, 36}, []int{45, 45}, "+25.0%", "FAIL"},
		{[]int{36, 40}, []int{45, 45}, "+18.4%", "NOISY (identical runs ±5%)"},
		{[]int{65, 67, 71}, []int{101, 52, 53}, "+1.5%", "NOISY (identical runs ±36%)"},
	} {
		tc := &TracingCase{Rate: TracingRate, Duration: 12 * time.Second}
		for _, v := range c.off {
			tc.Off = append(tc.Off, run(v, nil))
		}
		for _, v := range c.on {
			tc.On = append(tc.On, run(v, nil))
		}
		rows := tracingRows(tc)
		if rows[0][4] != c.ratio || rows[0][6] != c.result {
			t.Errorf("off %v on %v: ratio %q result %q, want %q %q", c.off, c.on, rows[0][4], rows[0][6], c.ratio, c.result)
		}
	}
	lost := TracingRun{LatencyRun: LatencyRun{Sent: 100}, Spans: 119}
	if err := lost.SpanErr(true); err == nil {
		t.Error("a traced run with a span missing passed")
	}
	if err := (TracingRun{LatencyRun: LatencyRun{Sent: 100}, Spans: 120}).SpanErr(true); err != nil {
		t.Error(err)
	}
	if err := (TracingRun{Spans: 1}).SpanErr(false); err == nil {
		t.Error("an untraced run with a span passed")
	}
}
