package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// DefaultKafkaVersion is the Apache Kafka release the harness starts unless
// EnvKafkaVersion names another (test/kafka/pom.xml resolves any release
// published as org.apache.kafka:kafka_2.13).
const DefaultKafkaVersion = "4.4.0"

// EnvKafkaVersion overrides DefaultKafkaVersion.
const EnvKafkaVersion = "OUTBOXD_TEST_KAFKA_VERSION"

// EnvKafkaCache overrides the directory holding kafka-<version>/libs
// (default: the user cache dir, e.g. ~/.cache/outboxd).
const EnvKafkaCache = "OUTBOXD_KAFKA_CACHE"

// KafkaVersion is the Apache Kafka version the harness uses.
func KafkaVersion() string {
	if v := os.Getenv(EnvKafkaVersion); v != "" {
		return v
	}
	return DefaultKafkaVersion
}

// KafkaLibs returns the directory of the broker jars of version, fetching
// them with Maven (test/kafka/pom.xml) when the cache lacks them. The fetch
// goes to a private directory renamed into place, so test processes running
// in parallel can share the cache.
func KafkaLibs(ctx context.Context, version string) (string, error) {
	base := os.Getenv(EnvKafkaCache)
	if base == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("kafka jars: no cache dir (set %s): %w", EnvKafkaCache, err)
		}
		base = filepath.Join(dir, "outboxd")
	}
	libs := filepath.Join(base, "kafka-"+version, "libs")
	marker := filepath.Join(libs, "kafka_2.13-"+version+".jar")
	if _, err := os.Stat(marker); err == nil {
		return libs, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		return "", fmt.Errorf("kafka jars for %s are not in %s and Maven (mvn) is not installed: run .ci/kafka.sh or install maven", version, libs)
	}
	if err := os.MkdirAll(filepath.Dir(libs), 0o755); err != nil {
		return "", fmt.Errorf("kafka jars: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(libs), "libs-fetch-")
	if err != nil {
		return "", fmt.Errorf("kafka jars: %w", err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "-f", filepath.Join(root, "test", "kafka", "pom.xml"),
		"dependency:copy-dependencies", "-Dkafka.version="+version, "-DoutputDirectory="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("fetching Apache Kafka %s with Maven: %w\n%s", version, err, tail(string(out), 4096))
	}
	if err := os.Rename(tmp, libs); err != nil && !errors.Is(err, os.ErrExist) {
		// Another process may have won the race: its copy is as good.
		if _, serr := os.Stat(marker); serr != nil {
			return "", fmt.Errorf("kafka jars: %w", err)
		}
	}
	if _, err := os.Stat(marker); err != nil {
		return "", fmt.Errorf("kafka jars: %s missing after the fetch", marker)
	}
	return libs, nil
}
