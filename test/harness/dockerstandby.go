package harness

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/testcontainers/testcontainers-go"
)

// startDockerStandby is StartStandby on the docker backend: a second
// container of the PostgreSQL image whose first start runs pg_basebackup
// from the primary (host network, 127.0.0.1) through the physical slot
// name, with -R (standby.signal and primary_conninfo, application_name
// name), then runs postgres as a hot standby. A restart of the container
// keeps its data directory and skips the base backup.
func (p *Postgres) startDockerStandby(ctx context.Context, conn *pgx.Conn, name string, version int) (*Postgres, error) {
	img, err := PostgresImage(ctx)
	if err != nil {
		return nil, err
	}
	var conf [][2]string
	for _, kv := range defaultConf("") {
		if kv[0] != "unix_socket_directories" {
			conf = append(conf, kv)
		}
	}
	conf = append(conf, [2]string{"hot_standby", "on"}, [2]string{"hot_standby_feedback", "on"})
	if version >= 170000 {
		conf = append(conf, [2]string{"sync_replication_slots", "on"}, [2]string{"synchronized_standby_slots", ""})
	}
	var args []string
	for _, kv := range conf {
		args = append(args, "-c "+kv[0]+"="+kv[1])
	}
	// The postmaster binds its port after FreePort let it go, and a server
	// another suite started meanwhile may take it (make test runs suites
	// side by side): a container whose postgres could not bind is removed
	// and a new one (a new base backup) runs on a new port.
	var s *Postgres
	var port int
	if err := onFreePort(ctx, &port, func() error {
		// The image's entrypoint runs a command other than postgres as is (as
		// root): prepare the data directory, then drop to postgres.
		inner := fmt.Sprintf(`[ -s "$PGDATA/PG_VERSION" ] || pg_basebackup -d "host=127.0.0.1 port=%d user=postgres application_name=%s" -D "$PGDATA" -c fast -X stream -S %s -R; exec postgres -c port=%d %s`,
			p.port, name, name, port, strings.Join(args, " "))
		script := `set -e; export PGDATA=/var/lib/postgresql/data; mkdir -p "$PGDATA" /var/run/postgresql; ` +
			`chown postgres:postgres "$PGDATA" /var/run/postgresql; chmod 700 "$PGDATA"; ` +
			`exec setpriv --reuid=postgres --regid=postgres --init-groups sh -c '` + inner + `'`
		ctr, err := runContainer(ctx, "postgres-standby", testcontainers.ContainerRequest{Image: img, Entrypoint: []string{"sh", "-c", script}})
		if err != nil {
			return err
		}
		s = &Postgres{port: port, adminDB: "postgres", ctr: ctr}
		if err := s.dockerWaitReady(ctx); err != nil {
			logs := ctr.logs(ctx)
			s.Close()
			return fmt.Errorf("standby container: %w\n%s", err, tail(logs, 4096))
		}
		return nil
	}, func(err error) bool { return pgBindFailed(err.Error()) }); err != nil {
		return nil, err
	}
	if err := waitStreaming(ctx, conn, name); err != nil {
		logs := s.ctr.logs(ctx)
		s.Close()
		return nil, fmt.Errorf("%w\nstandby log tail:\n%s", err, tail(logs, 4096))
	}
	return s, nil
}

// dockerKill is Kill in a container: SIGQUIT to the postmaster (pg_ctl
// stop -m immediate), waiting for the container to exit.
func (p *Postgres) dockerKill(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ctr.running(ctx) {
		return nil
	}
	return p.ctr.signal(ctx, "SIGQUIT", true)
}

// dockerPromote is Promote in a container: pg_promote, which waits.
func (p *Postgres) dockerPromote(ctx context.Context) error {
	conn, err := p.Connect(ctx, p.adminDB)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("pg_promote: %v (promoted %v)", err, ok)
	}
	return nil
}
