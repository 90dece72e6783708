package main

import (
	"flag"
	"strings"
	"testing"
	"time"
)

// Every duration and size option of outboxd run, found by type so that an
// option added later is covered too: a sign and a unit are checked the same
// way for all of them, from the command line and from the environment.
func TestEveryDurationAndSizeFlag(t *testing.T) {
	var o runOptions
	set := newOptionSet("run", "router", "tables")
	o.register(set)
	var durations, sizes []string
	set.fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(*byteSize); ok {
			sizes = append(sizes, f.Name)
		} else if g, ok := f.Value.(flag.Getter); ok {
			if _, ok := g.Get().(time.Duration); ok {
				durations = append(durations, f.Name)
			}
		}
	})
	// Not vacuous: the options of today are all found.
	for _, want := range []string{"shutdown-timeout", "status-interval", "confirm-interval", "replication-timeout", "kafka-linger", "heartbeat-interval", "poll-interval", "transaction-timeout"} {
		if !strings.Contains(","+strings.Join(durations, ",")+",", ","+want+",") {
			t.Errorf("duration option --%s not found (found %v)", want, durations)
		}
	}
	if strings.Join(sizes, ",") != "max-inflight-bytes,max-message-bytes,max-slot-lag,rabbitmq-max-message-size" {
		t.Errorf("size options %v", sizes)
	}

	type row struct {
		value string
		want  string // "" accepted; else the error must contain it
		got   any    // the value parsed, when accepted
	}
	durationRows := []row{
		{"-2ms", "must not be negative (got -2ms)", nil},
		{"-1s", "must not be negative", nil},
		{"5", "missing unit", nil},
		{"soon", "invalid duration", nil},
		{"0", "", time.Duration(0)},
		{"250ms", "", 250 * time.Millisecond},
		{"1m30s", "", 90 * time.Second},
	}
	sizeRows := []row{
		{"-1", "must not be negative", nil},
		{"-1kB", "must not be negative", nil},
		{"1 parsec", "want a byte count", nil},
		{"9999999999TB", "too large", nil},
		{"0", "", byteSize(0)},
		{"1048576", "", byteSize(1 << 20)},
		{"1kB", "", byteSize(1000)},
		{"1KB", "", byteSize(1000)},
		{"1kb", "", byteSize(1000)},
		{"1KiB", "", byteSize(1024)},
		{"1kib", "", byteSize(1024)},
		{"64MiB", "", byteSize(64 << 20)},
		{"64MB", "", byteSize(64e6)},
		{"1GB", "", byteSize(1e9)},
		{"1gib", "", byteSize(1 << 30)},
		{"2 GiB", "", byteSize(2 << 30)},
		{"512B", "", byteSize(512)},
	}
	check := func(t *testing.T, name string, r row, viaEnv bool) {
		var args []string
		env := map[string]string{}
		if viaEnv {
			env[envName(name)] = r.value
		} else {
			args = []string{"--" + name, r.value}
		}
		o, set, err := parseRun(t, args, env, "")
		if r.want != "" {
			if err == nil || !strings.Contains(err.Error(), r.want) || !strings.Contains(err.Error(), "--"+name) {
				t.Fatalf("--%s %q: error %v, want it to name --%s and contain %q", name, r.value, err, name, r.want)
			}
			return
		}
		if err != nil {
			t.Fatalf("--%s %q: %v", name, r.value, err)
		}
		_ = o
		var got any
		if b, ok := set.fs.Lookup(name).Value.(*byteSize); ok {
			got = *b
		} else {
			got = set.fs.Lookup(name).Value.(flag.Getter).Get()
		}
		if got != r.got {
			t.Fatalf("--%s %q parsed as %v, want %v", name, r.value, got, r.got)
		}
	}
	for _, name := range durations {
		for _, r := range durationRows {
			t.Run(name+"="+r.value, func(t *testing.T) { check(t, name, r, false) })
		}
		t.Run(name+"=env-negative", func(t *testing.T) { check(t, name, row{"-3s", "must not be negative", nil}, true) })
		t.Run(name+"=env-no-unit", func(t *testing.T) { check(t, name, row{"5", "missing unit", nil}, true) })
	}
	for _, name := range sizes {
		for _, r := range sizeRows {
			t.Run(name+"="+r.value, func(t *testing.T) { check(t, name, r, false) })
		}
		t.Run(name+"=env-kB", func(t *testing.T) { check(t, name, row{"4kB", "", byteSize(4000)}, true) })
	}
}

// The positive-only options are refused at zero by validate, naming them.
func TestPositiveOnlyOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--confirm-interval", "0"}, "--confirm-interval"},
		{[]string{"--poll-interval", "0"}, "--poll-interval"},
		{[]string{"--status-interval", "0"}, "--status-interval"},
		{[]string{"--max-inflight-bytes", "0"}, "--max-inflight-bytes"},
		{[]string{"--max-message-bytes", "1kB", "--exactly-once"}, ""},
		{[]string{"--max-message-bytes", "100B"}, "--max-message-bytes"},
	} {
		o, _, err := parseRun(t, append([]string{"--postgres", "postgres://h/db", "--kafka-brokers", "k:9092"}, tc.args...), nil, "")
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		err = o.validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%v: %v", tc.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: validate %v, want it to name %s", tc.args, err, tc.want)
		}
	}
}
