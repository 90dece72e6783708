package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// SASL/SCRAM over TLS end to end, the password from the environment for one
// mechanism and from a file for another, and never in the log.
func TestKafkaSASLAndTLS(t *testing.T) {
	for _, tc := range []struct {
		mech, secret string
		viaFile      bool
	}{
		{"SCRAM-SHA-512", "s3cret-512", false},
		{"PLAIN", "pl4in-secret", true},
	} {
		t.Run(tc.mech, func(t *testing.T) {
			if os.Getenv(harness.EnvKafka) != "" {
				t.Skip("needs a harness-started broker with SASL and TLS")
			}
			cert, key, err := harness.SelfSignedCert(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			k := harness.KafkaForTest(t, harness.WithSASL(tc.mech, "relay", tc.secret), harness.WithTLS(cert, key))
			f := newFixture(t, withKafka(k))
			args := []string{"--kafka-tls-ca", cert, "--kafka-sasl-mechanism", tc.mech, "--kafka-sasl-user", "relay"}
			if tc.viaFile {
				pf := filepath.Join(t.TempDir(), "password")
				if err := os.WriteFile(pf, []byte(tc.secret+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--kafka-sasl-password-file", pf)
			} else {
				f.env = []string{"OUTBOXD_KAFKA_SASL_PASSWORD=" + tc.secret}
			}
			r := f.startRelay(args...)
			end := f.commit(event{1, "secure-1", "E", `{"tls": true}`})
			f.waitConfirmed(end, 30*time.Second)
			recs := f.records()
			if len(recs) != 1 || string(recs[0].Value) != `{"tls": true}` {
				t.Fatalf("records %v", recs)
			}
			if strings.Contains(r.Log(), tc.secret) {
				t.Fatal("the SASL password appears in the log")
			}
		})
	}
}
