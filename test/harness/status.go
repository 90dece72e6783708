package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Status reads outboxd's /status document from its --http-addr.
func Status(ctx context.Context, addr string) (map[string]any, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := get(rctx, addr, "/status")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("/status of %s (HTTP %d): %w", addr, resp.StatusCode, err)
	}
	return st, nil
}

// WaitStatus polls outboxd's /status every 20 ms until cond holds. It fails
// early when p exits (p may be nil), and when ctx ends. Waiting on /status
// rather than on the log leaves the log's wording free to change.
func WaitStatus(ctx context.Context, p *Proc, addr, what string, cond func(st map[string]any) bool) error {
	var last map[string]any
	var lastErr error
	for {
		st, err := Status(ctx, addr)
		if err == nil && cond(st) {
			return nil
		}
		if err != nil {
			lastErr = err
		} else {
			last, lastErr = st, nil
		}
		if p != nil && p.Exited() {
			return fmt.Errorf("outboxd exited while waiting for %s on /status (last %v, error %v)", what, last, lastErr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s on /status: %w (last %v, error %v)", what, ctx.Err(), last, lastErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Streaming reports a /status document of an outboxd streaming from its slot.
func Streaming(st map[string]any) bool { return st["streaming"] == true }

// WaitStreaming waits until outboxd streams from its slot.
func WaitStreaming(ctx context.Context, p *Proc, addr string) error {
	return WaitStatus(ctx, p, addr, "streaming", Streaming)
}

// Metrics scrapes outboxd's /metrics from its --http-addr: each sample's
// value by its series as exposed, "name" or `name{label="value"}`.
func Metrics(ctx context.Context, addr string) (map[string]float64, error) {
	resp, err := get(ctx, addr, "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		// A label value may hold spaces; the sample value (no timestamp
		// here) follows the last one.
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// get GETs path from outboxd's HTTP endpoints at addr; the caller closes
// the body.
func get(ctx context.Context, addr, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}
