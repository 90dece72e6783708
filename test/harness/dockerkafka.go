package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
)

// kfakedReady is the line kfaked prints once it serves.
const kfakedReady = "kfaked listening on "

// startDocker runs kfaked in a container from KfakedImage (a scratch image
// with the static binary) when EnvBackend is "docker"; ok reports whether
// it did (or failed trying). There is no Apache Kafka image variant yet:
// kfaked takes the SASL and TLS settings of KafkaOption as flags.
func (k *kfakeKafka) startDocker(ctx context.Context) (_ *kfakeKafka, ok bool, err error) {
	if docker, err := dockerBackend(); !docker || err != nil {
		return nil, err != nil, err
	}
	img, err := KfakedImage(ctx)
	if err != nil {
		return nil, true, err
	}
	if err := onFreePort(ctx, &k.port, func() error { return k.runDocker(ctx, img) },
		func(err error) bool { return strings.Contains(err.Error(), "address already in use") }); err != nil {
		return nil, true, err
	}
	return k, true, nil
}

func (k *kfakeKafka) runDocker(ctx context.Context, img string) error {
	args := []string{"-port", strconv.Itoa(k.port), "-data-dir", "/data", "-partitions", strconv.Itoa(k.opts.partitions)}
	if k.opts.noAutoCreate {
		args = append(args, "-auto-create=false")
	}
	if k.opts.saslUser != "" {
		args = append(args, "-sasl-mechanism", k.opts.saslMech, "-sasl-user", k.opts.saslUser, "-sasl-pass", k.opts.saslPass)
	}
	var binds []string
	if k.opts.certFile != "" {
		// The PEM files at the same paths inside, read-only.
		for _, f := range []string{k.opts.certFile, k.opts.keyFile} {
			abs, err := filepath.Abs(f)
			if err != nil {
				return err
			}
			binds = append(binds, abs+":"+abs+":ro")
		}
		args = append(args, "-tls-cert", k.opts.certFile, "-tls-key", k.opts.keyFile)
	}
	if k.opts.clientCA != "" {
		abs, err := filepath.Abs(k.opts.clientCA)
		if err != nil {
			return err
		}
		binds = append(binds, abs+":"+abs+":ro")
		args = append(args, "-tls-client-ca", k.opts.clientCA)
	}
	ctr, err := runContainer(ctx, "kfaked", testcontainers.ContainerRequest{
		Image:              img,
		Cmd:                args,
		HostConfigModifier: func(hc *container.HostConfig) { hc.Binds = append(hc.Binds, binds...) },
		// As the test's user, like the process backend: it can read the
		// TLS key (mode 0600) the test wrote.
		ConfigModifier: func(c *container.Config) { c.User = fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid()) },
	})
	if err != nil {
		return err
	}
	if err := ctr.waitLog(ctx, kfakedReady, 0); err != nil {
		ctr.close()
		return err
	}
	k.ctr, k.brokers = ctr, []string{"127.0.0.1:" + strconv.Itoa(k.port)}
	return nil
}

// dockerStart starts the stopped container again: same port, same /data.
func (k *kfakeKafka) dockerStart(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ctr.running(ctx) {
		return nil
	}
	started := strings.Count(k.ctr.logs(ctx), kfakedReady)
	if err := k.ctr.start(ctx); err != nil {
		return err
	}
	return k.ctr.waitLog(ctx, kfakedReady, started)
}

// dockerStop is a clean stop: SIGTERM, kfaked persists its state.
func (k *kfakeKafka) dockerStop() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return k.ctr.stop(ctx, time.Minute)
}

func (k *kfakeKafka) dockerKill() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !k.ctr.running(ctx) {
		return nil
	}
	return k.ctr.signal(ctx, "SIGKILL", true)
}

// dockerPause freezes the container (docker pause); dockerResume thaws it.
func (k *kfakeKafka) dockerPause(resume bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if resume {
		return k.ctr.unpause(ctx)
	}
	return k.ctr.pause(ctx)
}

// dockerLogFile writes the container's output so far to kfaked.log in a
// temp dir made on first use (so a killed test process leaves none
// behind), and returns its path.
func (k *kfakeKafka) dockerLogFile() string {
	if k.dir == "" {
		dir, err := os.MkdirTemp("", "outboxd-kafka-")
		if err != nil {
			return ""
		}
		k.dir = dir
	}
	path := filepath.Join(k.dir, "kfaked.log")
	_ = os.WriteFile(path, []byte(k.ctr.logs(context.Background())), 0o644)
	return path
}

func (k *kfakeKafka) dockerClose() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ctr.close()
	if k.dir != "" {
		_ = os.RemoveAll(k.dir)
	}
}

// ContainerID is the container running the broker ("" unless EnvBackend
// is docker).
func (k *kfakeKafka) ContainerID() string {
	if k.ctr == nil {
		return ""
	}
	return k.ctr.id()
}

// ContainerID is the container running the broker ("" unless EnvBackend
// is docker; the container backend's broker is kfaked).
func (k *Kafka) ContainerID() string {
	if kf, ok := k.kafkaBackend.(*kfakeKafka); ok {
		return kf.ContainerID()
	}
	return ""
}
