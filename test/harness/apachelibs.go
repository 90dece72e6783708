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
// them with Maven (test/kafka/pom.xml) when the cache lacks them.
func KafkaLibs(ctx context.Context, version string) (string, error) {
	return mavenLibs(ctx, mavenJars{
		what: "Apache Kafka " + version, dir: "kafka-" + version, marker: "kafka_2.13-" + version + ".jar",
		pom: filepath.Join("test", "kafka", "pom.xml"), props: []string{"-Dkafka.version=" + version}, script: ".ci/kafka.sh",
	})
}

// mavenJars names one set of jars the harness fetches with Maven.
type mavenJars struct {
	what   string   // for errors: "Apache Kafka 4.4.0"
	dir    string   // under the cache: <dir>/libs
	marker string   // a jar whose presence means the set is complete
	pom    string   // relative to the module root
	props  []string // -D options for mvn
	script string   // the .ci script that fetches them
}

// mavenLibs returns the cache directory of j's jars, fetching them with
// Maven when the cache lacks them. The fetch goes to a private directory
// renamed into place, so test processes running in parallel can share the
// cache.
func mavenLibs(ctx context.Context, j mavenJars) (string, error) {
	base := os.Getenv(EnvKafkaCache)
	if base == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("%s jars: no cache dir (set %s): %w", j.what, EnvKafkaCache, err)
		}
		base = filepath.Join(dir, "outboxd")
	}
	libs := filepath.Join(base, j.dir, "libs")
	marker := filepath.Join(libs, j.marker)
	if _, err := os.Stat(marker); err == nil {
		return libs, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		return "", fmt.Errorf("%s jars are not in %s and Maven (mvn) is not installed: run %s or install maven", j.what, libs, j.script)
	}
	if err := os.MkdirAll(filepath.Dir(libs), 0o755); err != nil {
		return "", fmt.Errorf("%s jars: %w", j.what, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(libs), "libs-fetch-")
	if err != nil {
		return "", fmt.Errorf("%s jars: %w", j.what, err)
	}
	defer os.RemoveAll(tmp)
	args := append([]string{"-q", "-B", "-f", filepath.Join(root, j.pom), "dependency:copy-dependencies"}, j.props...)
	cmd := exec.CommandContext(ctx, "mvn", append(args, "-DoutputDirectory="+tmp)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("fetching %s with Maven: %w\n%s", j.what, err, tail(string(out), 4096))
	}
	if err := os.Rename(tmp, libs); err != nil && !errors.Is(err, os.ErrExist) {
		// Another process may have won the race: its copy is as good.
		if _, serr := os.Stat(marker); serr != nil {
			return "", fmt.Errorf("%s jars: %w", j.what, err)
		}
	}
	if _, err := os.Stat(marker); err != nil {
		return "", fmt.Errorf("%s jars: %s missing after the fetch", j.what, marker)
	}
	return libs, nil
}
