// Package docker_test runs outboxd's container artefacts for real: the
// image built from deploy/Dockerfile (on locally made bases where no
// registry is reachable) against PostgreSQL and Kafka, and deploy/compose.yaml
// brought up with local stand-in images. It needs a Docker engine with
// BuildKit (docker buildx) and the compose plugin: bash .ci/docker.sh
// installs and starts them. OUTBOXD_SKIP_DOCKER_TESTS=1 skips the package
// on a machine without Docker.
//
// Every container runs on the host network, so all traffic stays on
// 127.0.0.1; everything a test starts (containers, images, volumes) is
// removed when it ends. The local base images (outboxd-test/*) are kept:
// their tags carry a content hash, so later runs reuse them.
package docker_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

func TestMain(m *testing.M) {
	if os.Getenv("OUTBOXD_SKIP_DOCKER_TESTS") == "1" {
		fmt.Println("test/docker: skipped (OUTBOXD_SKIP_DOCKER_TESTS=1)")
		os.Exit(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := harness.CheckDocker(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/docker:", err, "(or set OUTBOXD_SKIP_DOCKER_TESTS=1 to skip these tests)")
		os.Exit(1)
	}
	code := m.Run()
	removeBuiltImage()
	os.Exit(code)
}
