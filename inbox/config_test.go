package inbox

import (
	"strings"
	"testing"
)

// A Config missing what it needs says what to set, all at once.
func TestConfigErrorsSayWhatToSet(t *testing.T) {
	_, err := New(Config{})
	if err == nil {
		t.Fatal("New(Config{}) succeeded")
	}
	for _, want := range []string{"Brokers", "Group", "Topics", "DB", "Handler"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	c := Config{OnPoison: Hold, DeadLetterTopic: "dlt"}
	if err := c.setDefaults(); err == nil || !strings.Contains(err.Error(), "DeadLetterTopic is set with OnPoison Hold") {
		t.Errorf("Hold with a dead-letter topic: %v", err)
	}
}
