package harness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The lifecycle of the docker backend (Stop/Start, Restart modes, Kill,
// Pause, SASL/TLS) is tested by running this package's TestPostgres* and
// TestKafka* with OUTBOXD_TEST_BACKEND=docker (make test does), and
// test/e2e on it. The tests here cover what is specific to containers.

const reaperHelperEnv = "OUTBOXD_HARNESS_DOCKER_REAPER_HELPER"

// TestDockerContainersOnHostNetwork: the backend's containers use the host
// network and no network is created (testcontainers-go would otherwise add
// a bridge network with a private-range subnet when "bridge" is missing).
func TestDockerContainersOnHostNetwork(t *testing.T) {
	t.Setenv(EnvBackend, "docker")
	t.Setenv(EnvPostgres, "")
	t.Setenv(EnvKafka, "")
	ctx := testCtx(t, 5*time.Minute)
	pg := PostgresForTest(t)
	k := KafkaForTest(t)
	for _, id := range []string{pg.ContainerID(), k.ContainerID()} {
		if id == "" {
			t.Fatal("no container: the docker backend was not used")
		}
		mode, err := DockerCLI(ctx, "inspect", "--format", "{{.HostConfig.NetworkMode}} {{len .NetworkSettings.Networks}} {{index .Config.Labels \""+ContainerLabel+"\"}}", id)
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(mode); len(f) != 3 || f[0] != "host" || f[1] != "1" {
			t.Errorf("container %s: network mode, networks, label = %q; want host 1 <name>", id, mode)
		}
	}
	// Networks testcontainers-go made carry its label (reaper_default did).
	nets, err := DockerCLI(ctx, "network", "ls", "--format", "{{.Name}}", "--filter", "label=org.testcontainers=true")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(nets) != "" {
		t.Errorf("testcontainers-go created networks: %q", nets)
	}
}

// TestDockerReaper: containers of a test process that dies by SIGKILL,
// without running any cleanup, are removed by their watchdog.
func TestDockerReaper(t *testing.T) {
	if os.Getenv(reaperHelperEnv) == "1" {
		reaperHelper()
		return
	}
	ctx := testCtx(t, 5*time.Minute)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDockerReaper$", "-test.count=1")
	cmd.Env = append(os.Environ(), reaperHelperEnv+"=1", EnvBackend+"=docker", EnvPostgres+"=", EnvKafka+"=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	sc := bufio.NewScanner(stdout)
	for len(ids) < 2 && sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "container "); ok {
			ids = append(ids, id)
		}
	}
	if len(ids) != 2 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper reported containers %q, want 2", ids)
	}
	t.Cleanup(func() { // only acts if the test failed
		for _, id := range ids {
			_, _ = DockerCLI(context.Background(), "rm", "-f", "-v", id)
		}
	})
	for _, id := range ids {
		if _, err := DockerCLI(ctx, "inspect", id); err != nil {
			t.Fatalf("container %s of the helper is not there: %v", id, err)
		}
	}
	_ = cmd.Process.Kill() // SIGKILL: no cleanup runs in the helper
	_ = cmd.Wait()
	deadline := time.Now().Add(time.Minute)
	for _, id := range ids {
		for exec.CommandContext(ctx, "docker", "inspect", id).Run() == nil {
			if time.Now().After(deadline) {
				t.Fatalf("container %s still exists a minute after its test process died", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// reaperHelper starts a server and a broker, reports their containers and
// waits to be killed.
func reaperHelper() {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg, err := StartPostgres(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	k, err := StartKafka(ctx)
	if err != nil {
		pg.Close()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("container %s\ncontainer %s\n", pg.ContainerID(), k.ContainerID())
	<-ctx.Done()
	k.Close()
	pg.Close()
	os.Exit(1)
}
