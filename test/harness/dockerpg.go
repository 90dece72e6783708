package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/testcontainers/testcontainers-go"
)

// dockerPostgres starts PostgreSQL in a container when EnvBackend is
// "docker"; ok reports whether it did (or failed trying).
func dockerPostgres(ctx context.Context, o pgOptions) (p *Postgres, ok bool, err error) {
	if docker, err := dockerBackend(); !docker || err != nil {
		return nil, err != nil, err
	}
	p, err = startDockerPostgres(ctx, o)
	return p, true, err
}

// startDockerPostgres runs the postgres image (official or local stand-in,
// see PostgresImage) with the harness's settings as -c options on a free
// port of 127.0.0.1. Its data lives in the container, so Stop/Start and
// Restart keep it.
func startDockerPostgres(ctx context.Context, o pgOptions) (*Postgres, error) {
	img, err := PostgresImage(ctx)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		conf := [][2]string{{"port", fmt.Sprint(port)}}
		for _, kv := range append(defaultConf(""), o.conf...) {
			if kv[0] != "unix_socket_directories" {
				conf = append(conf, kv)
			}
		}
		cmd := []string{"postgres"}
		for _, kv := range conf {
			cmd = append(cmd, "-c", kv[0]+"="+kv[1])
		}
		ctr, err := runContainer(ctx, "postgres", testcontainers.ContainerRequest{
			Image: img,
			Cmd:   cmd,
			Env:   map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"},
		})
		if err != nil {
			return nil, err
		}
		p := &Postgres{port: port, adminDB: "postgres", ctr: ctr}
		if err = p.dockerWaitReady(ctx); err == nil {
			return p, nil
		}
		logs := ctr.logs(ctx)
		ctr.close()
		if attempt == 3 || !pgBindFailed(logs) {
			return nil, fmt.Errorf("postgres container (%s): %w\n%s", img, err, tail(logs, 4096))
		}
	}
}

// dockerWaitReady polls until a connection succeeds, failing early if the
// container exits (a bad setting, a taken port).
func (p *Postgres) dockerWaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(attempt, p.DSN(p.adminDB))
		cancelAttempt()
		if err == nil {
			return conn.Close(ctx)
		}
		if !p.ctr.running(ctx) {
			return fmt.Errorf("container exited: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for postgres to accept connections: %w (last error: %w)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *Postgres) dockerStart(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ctr.start(ctx); err != nil {
		return err
	}
	return p.dockerWaitReady(ctx)
}

// dockerStop is pg_ctl stop -m fast: docker stop sends the image's
// STOPSIGNAL, SIGINT.
func (p *Postgres) dockerStop(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ctr.stop(ctx, 2*time.Minute)
}

// dockerRestart sends the postmaster the signal of the pg_ctl shutdown mode
// (smart SIGTERM, fast SIGINT, immediate SIGQUIT), waits for the container
// to exit and starts it again.
func (p *Postgres) dockerRestart(ctx context.Context, mode string) error {
	sig := map[string]string{"smart": "SIGTERM", "fast": "SIGINT", "immediate": "SIGQUIT"}[mode]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctr.running(ctx) {
		if err := p.ctr.signal(ctx, sig, true); err != nil {
			return err
		}
	}
	if err := p.ctr.start(ctx); err != nil {
		return err
	}
	return p.dockerWaitReady(ctx)
}

func (p *Postgres) dockerClose() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctr.close()
	if p.root != "" {
		_ = os.RemoveAll(p.root)
	}
}

// dockerLogFile writes the container's output so far (the server log: the
// harness turns logging_collector off) to a file in a temp dir made on
// first use (so a killed test process leaves none behind), and returns its
// path.
func (p *Postgres) dockerLogFile() string {
	if p.root == "" {
		dir, err := os.MkdirTemp("", "outboxd-pg-")
		if err != nil {
			return ""
		}
		p.root = dir
	}
	path := filepath.Join(p.root, "postgres.log")
	_ = os.WriteFile(path, []byte(p.ctr.logs(context.Background())), 0o644)
	return path
}

// ContainerID is the container running the server ("" unless EnvBackend
// is docker).
func (p *Postgres) ContainerID() string {
	if p.ctr == nil {
		return ""
	}
	return p.ctr.id()
}
