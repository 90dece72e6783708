package main

import (
	"strings"
	"testing"
)

// A misspelt OUTBOXD_* variable is not silently ignored: outboxd run warns
// about it and names the option it was probably meant to be.
func TestUnknownEnvironmentVariables(t *testing.T) {
	var o runOptions
	set := newOptionSet("run", "router", "tables")
	o.register(set)
	got := set.unknownEnv([]string{
		"OUTBOXD_KAFKA_BROKER=k:9092",        // one letter short
		"OUTBOXD_POSTGRES=postgres://db/app", // known
		"OUTBOXD_SLOTT=x",                    // typo
		"OUTBOXD_TEST_POSTGRES=postgres://x", // the test harness's, not outboxd's
		"PATH=/bin",
		"OUTBOXD_SOMETHING_ELSE_ENTIRELY=1",  // too far from every option to guess
		"OUTBOXD_KAFKA_SASL_PASSWORD=secret", // known (and its value never shown)
	})
	want := []string{
		"OUTBOXD_KAFKA_BROKER is no option of outboxd run and is ignored: did you mean OUTBOXD_KAFKA_BROKERS?",
		"OUTBOXD_SLOTT is no option of outboxd run and is ignored: did you mean OUTBOXD_SLOT?",
		"OUTBOXD_SOMETHING_ELSE_ENTIRELY is no option of outboxd run and is ignored",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
