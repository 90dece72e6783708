package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// EnvBackend selects how the harness runs PostgreSQL and Kafka: unset or
// "process" runs them as child processes; "docker" runs them as containers
// through testcontainers-go (host networking, so they listen on 127.0.0.1
// like the processes do). OUTBOXD_TEST_POSTGRES / OUTBOXD_TEST_KAFKA still
// take precedence.
const EnvBackend = "OUTBOXD_TEST_BACKEND"

// dockerBackend reports whether EnvBackend asks for containers.
func dockerBackend() (bool, error) {
	switch v := os.Getenv(EnvBackend); v {
	case "", "process":
		return false, nil
	case "docker":
		return true, nil
	default:
		return false, fmt.Errorf("%s=%q: want docker or process (the default)", EnvBackend, v)
	}
}

// ContainerLabel marks every container the harness starts, so that
// `docker ps -a --filter label=org.outboxd.test` finds leftovers.
const ContainerLabel = "org.outboxd.test"

// testContainer is one container started through testcontainers-go, with a
// watchdog that removes it if the test process dies without cleaning up:
// Ryuk (testcontainers' own reaper) needs an image from a registry, so it
// is disabled and this does its job.
type testContainer struct {
	name   string
	tc     testcontainers.Container
	cli    *testcontainers.DockerClient
	reaper *exec.Cmd
	stdin  io.WriteCloser
}

// runContainer creates a container from req on the host network, arms its
// watchdog, and starts it.
func runContainer(ctx context.Context, name string, req testcontainers.ContainerRequest) (*testContainer, error) {
	// testcontainers-go logs every lifecycle step; the harness reports errors.
	tclog.SetDefault(tclog.NewNoopLogger())
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		// Read once by testcontainers-go, before its first container.
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	if err := CheckDocker(ctx); err != nil {
		return nil, err
	}
	modify := req.HostConfigModifier
	req.HostConfigModifier = func(hc *container.HostConfig) {
		hc.NetworkMode = "host"
		if modify != nil {
			modify(hc)
		}
	}
	if req.Labels == nil {
		req.Labels = map[string]string{}
	}
	req.Labels[ContainerLabel] = name
	// testcontainers attaches containers to its default network, creating a
	// bridge network with a private-range subnet if "bridge" is missing (as
	// with dockerd --bridge=none). Naming "host" as the default bridge
	// network keeps every container on the host network and creates none.
	prov, err := testcontainers.NewDockerProvider(testcontainers.WithLogger(tclog.NewNoopLogger()), testcontainers.WithDefaultBridgeNetwork("host"))
	if err != nil {
		return nil, fmt.Errorf("testcontainers docker provider: %w", err)
	}
	tc, err := prov.CreateContainer(ctx, req)
	if err != nil {
		if tc != nil {
			_ = tc.Terminate(context.WithoutCancel(ctx))
		}
		return nil, fmt.Errorf("creating %s container from %s: %w", name, req.Image, err)
	}
	c := &testContainer{name: name, tc: tc}
	if c.cli, err = testcontainers.NewDockerClientWithOpts(ctx); err != nil {
		c.close()
		return nil, fmt.Errorf("docker client: %w", err)
	}
	if err := c.armReaper(); err != nil {
		c.close()
		return nil, err
	}
	if err := tc.Start(ctx); err != nil {
		logs := c.logs(ctx)
		c.close()
		return nil, fmt.Errorf("starting %s container: %w\n%s", name, err, logs)
	}
	return c, nil
}

// armReaper starts `sh` holding a pipe only this process writes: EOF means
// the test process is gone, and the container is removed with its volumes.
func (c *testContainer) armReaper() error {
	cmd := exec.Command("/bin/sh", "-c", `read _; docker rm -f -v "$1" >/dev/null 2>&1`, "outboxd-container-reaper", c.tc.GetContainerID())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("starting container reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting container reaper: %w", err)
	}
	c.reaper, c.stdin = cmd, stdin
	return nil
}

func (c *testContainer) id() string { return c.tc.GetContainerID() }

// running reports whether the container runs (paused counts as running).
func (c *testContainer) running(ctx context.Context) bool {
	st, err := c.tc.State(context.WithoutCancel(ctx))
	return err == nil && st.Running
}

// start starts a stopped container; a running one is left alone.
func (c *testContainer) start(ctx context.Context) error {
	if c.running(ctx) {
		return nil
	}
	if _, err := c.cli.ContainerStart(ctx, c.id(), client.ContainerStartOptions{}); err != nil {
		return fmt.Errorf("starting %s container: %w", c.name, err)
	}
	return nil
}

// stop sends the image's stop signal and waits up to timeout before SIGKILL.
func (c *testContainer) stop(ctx context.Context, timeout time.Duration) error {
	if err := c.tc.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("stopping %s container: %w", c.name, err)
	}
	return nil
}

// signal sends sig to the container's main process and, with wait, waits
// for the container to exit.
func (c *testContainer) signal(ctx context.Context, sig string, wait bool) error {
	if _, err := c.cli.ContainerKill(ctx, c.id(), client.ContainerKillOptions{Signal: sig}); err != nil {
		return fmt.Errorf("sending %s to %s container: %w", sig, c.name, err)
	}
	if !wait {
		return nil
	}
	for c.running(ctx) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s container to exit after %s: %w", c.name, sig, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// pause freezes every process of the container (cgroup freezer):
// connections stay open and nothing is answered.
func (c *testContainer) pause(ctx context.Context) error {
	if _, err := c.cli.ContainerPause(ctx, c.id(), client.ContainerPauseOptions{}); err != nil {
		return fmt.Errorf("pausing %s container: %w", c.name, err)
	}
	return nil
}

func (c *testContainer) unpause(ctx context.Context) error {
	if _, err := c.cli.ContainerUnpause(ctx, c.id(), client.ContainerUnpauseOptions{}); err != nil {
		return fmt.Errorf("resuming %s container: %w", c.name, err)
	}
	return nil
}

// logs returns the container's output so far (stdout and stderr).
func (c *testContainer) logs(ctx context.Context) string {
	rc, err := c.tc.Logs(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Sprintf("(no logs of %s container: %v)", c.name, err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(b)
}

// waitLog waits until the container's output has more than n occurrences
// of s, failing early if the container exits.
func (c *testContainer) waitLog(ctx context.Context, s string, n int) error {
	for {
		logs := c.logs(ctx)
		if strings.Count(logs, s) > n {
			return nil
		}
		if !c.running(ctx) {
			return fmt.Errorf("%s container exited before logging %q:\n%s", c.name, s, tail(logs, 4096))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s container to log %q: %w\n%s", c.name, s, ctx.Err(), tail(logs, 4096))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// close removes the container and its anonymous volumes, then disarms the
// watchdog. It never fails: it is meant for cleanup.
func (c *testContainer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.cli != nil {
		// A paused container would not stop until its stop timeout ran out.
		_, _ = c.cli.ContainerUnpause(ctx, c.id(), client.ContainerUnpauseOptions{})
		defer c.cli.Close()
	}
	err := c.tc.Terminate(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		// Leave the watchdog armed by closing its pipe: it retries removal.
		fmt.Fprintf(os.Stderr, "harness: removing %s container %s: %v\n", c.name, c.id(), err)
	}
	if c.stdin != nil {
		if err == nil {
			_ = c.reaper.Process.Kill()
		}
		_ = c.stdin.Close()
		_ = c.reaper.Wait()
	}
}
