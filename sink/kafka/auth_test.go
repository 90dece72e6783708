package kafka

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSASLAndCA(t *testing.T) {
	for name, want := range map[string]string{"PLAIN": "PLAIN", "SCRAM-SHA-256": "SCRAM-SHA-256", "SCRAM-SHA-512": "SCRAM-SHA-512"} {
		m, err := SASL(name, "u", "p")
		if err != nil || m.Name() != want {
			t.Errorf("SASL(%s): %v, %v", name, m, err)
		}
	}
	if _, err := SASL("GSSAPI", "u", "p"); err == nil || !strings.Contains(err.Error(), "SCRAM-SHA-512") {
		t.Errorf("GSSAPI: %v", err)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(bad); err == nil || err.Error() != "no PEM certificate in "+bad {
		t.Errorf("LoadCA of a non-PEM file: %v", err)
	}
	if _, err := LoadCA(filepath.Join(dir, "missing.pem")); !os.IsNotExist(err) {
		t.Errorf("LoadCA of a missing file: %v", err)
	}
}
