package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/schedbatch"
)

// TestSchedSwitchRefusalKeepsTheDefaultPolicy: a refused switch (a
// container whose seccomp profile denies sched_setattr) puts back what it
// may have moved, warns once with the fix, and never tries again: the
// default policy stays for the rest of the process.
func TestSchedSwitchRefusalKeepsTheDefaultPolicy(t *testing.T) {
	var calls []string
	var logs bytes.Buffer
	s := &schedSwitch{
		log: slog.New(slog.NewTextHandler(&logs, nil)),
		set: func() (schedbatch.Result, error) {
			calls = append(calls, "set")
			return schedbatch.Result{}, errors.New("operation not permitted")
		},
		reset: func() (schedbatch.Result, error) {
			calls = append(calls, "reset")
			return schedbatch.Result{}, nil
		},
	}
	s.draining(true)
	s.draining(false)
	s.draining(true)
	if got := strings.Join(calls, " "); got != "set reset" {
		t.Fatalf("calls %q, want %q (one try, put back, then nothing)", got, "set reset")
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, out)
	}
	for _, want := range []string{"operation not permitted", "fix=", "--sched-batch=false", "seccomp"} {
		if !strings.Contains(out, want) {
			t.Errorf("warning lacks %q:\n%s", want, out)
		}
	}
}

// TestSchedSwitchFollowsTheStream: draining moves the threads to
// SCHED_BATCH, quiet moves them back.
func TestSchedSwitchFollowsTheStream(t *testing.T) {
	var calls []string
	rec := func(name string) func() (schedbatch.Result, error) {
		return func() (schedbatch.Result, error) {
			calls = append(calls, name)
			return schedbatch.Result{Threads: 3}, nil
		}
	}
	s := &schedSwitch{log: slog.New(slog.DiscardHandler), set: rec("set"), reset: rec("reset")}
	s.draining(true)
	s.draining(false)
	s.draining(true)
	if got := strings.Join(calls, " "); got != "set reset set" {
		t.Fatalf("calls %q, want %q", got, "set reset set")
	}
}
