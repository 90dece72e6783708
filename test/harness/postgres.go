package harness

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnvPostgres names the environment variable holding a superuser DSN of an
// existing PostgreSQL server to use instead of starting a throwaway one.
const EnvPostgres = "OUTBOXD_TEST_POSTGRES"

// PGOption customizes a harness-started PostgreSQL server.
type PGOption func(*pgOptions)

type pgOptions struct {
	conf [][2]string // postgresql.conf settings, later entries win
}

// WithConf adds or overrides a postgresql.conf setting, for example
// WithConf("wal_level", "replica") for a negative test.
func WithConf(key, value string) PGOption {
	return func(o *pgOptions) { o.conf = append(o.conf, [2]string{key, value}) }
}

func defaultConf(socketDir string) [][2]string {
	return [][2]string{
		{"wal_level", "logical"},
		{"max_replication_slots", "32"},
		{"max_wal_senders", "32"},
		{"listen_addresses", "127.0.0.1"},
		{"unix_socket_directories", socketDir},
		{"fsync", "off"},
		{"full_page_writes", "off"},
		{"synchronous_commit", "on"},
		{"wal_sender_timeout", "60s"},
		{"max_connections", "200"},
		{"shared_buffers", "128MB"},
		{"logging_collector", "off"},
	}
}

const pgHBA = `# outboxd test harness: trust everything local
local all         all                trust
host  all         all  127.0.0.1/32  trust
local replication all                trust
host  replication all  127.0.0.1/32  trust
`

// Postgres is a PostgreSQL server for tests: either a throwaway server the
// harness initialized and controls, or an external one (see EnvPostgres).
type Postgres struct {
	mu      sync.Mutex // serializes lifecycle operations
	root    string     // temp dir holding the data dir and unix socket
	dataDir string
	port    int
	user    pgUser
	reaper  *reaper // stops the server if the test process dies

	extDSN  string // non-empty for an external server
	adminDB string // database used for administrative connections

	ctr *testContainer // the server's container (EnvBackend docker), see dockerpg.go
}

// StartPostgres initializes and starts a fresh server, or connects to the
// external server named by OUTBOXD_TEST_POSTGRES. Close it when done.
func StartPostgres(ctx context.Context, opts ...PGOption) (*Postgres, error) {
	if dsn := os.Getenv(EnvPostgres); dsn != "" {
		return externalPostgres(ctx, dsn)
	}
	var o pgOptions
	for _, opt := range opts {
		opt(&o)
	}
	if p, ok, err := dockerPostgres(ctx, o); ok {
		return p, err
	}
	u, err := lookupPGUser()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "outboxd-pg-")
	if err != nil {
		return nil, fmt.Errorf("creating postgres temp dir: %w", err)
	}
	p := &Postgres{root: root, dataDir: filepath.Join(root, "data"), user: u, adminDB: "postgres"}
	if err := p.initAndStart(ctx, o); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Postgres) initAndStart(ctx context.Context, o pgOptions) error {
	if err := p.user.chown(p.root); err != nil {
		return err
	}
	r, err := startReaper(p.user, p.dataDir, p.root)
	if err != nil {
		return err
	}
	p.reaper = r
	initdb := p.user.command(ctx, p.root, pgBinary("initdb"), "-D", p.dataDir, "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	conf := append(defaultConf(p.root), o.conf...)
	if err := appendConf(filepath.Join(p.dataDir, "postgresql.conf"), conf); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.dataDir, "pg_hba.conf"), []byte(pgHBA), 0o600); err != nil {
		return fmt.Errorf("writing pg_hba.conf: %w", err)
	}
	return p.startOnFreePort(ctx, "postgresql.conf")
}

// startOnFreePort starts the server on a free port, appended to confFile
// of the data directory (the last port setting wins). The postmaster binds
// it after FreePort let it go, and a server another suite started
// meanwhile may take it (make test runs suites side by side): a start that
// failed to bind (pgBindFailed) is tried again on a new port (onFreePort).
func (p *Postgres) startOnFreePort(ctx context.Context, confFile string) error {
	return onFreePort(ctx, &p.port, func() error {
		if err := appendConf(filepath.Join(p.dataDir, confFile), [][2]string{{"port", fmt.Sprint(p.port)}}); err != nil {
			return err
		}
		return p.Start(ctx)
	}, func(error) bool { return pgBindFailed(p.logTail(4096)) })
}

// pgBindFailed reports whether a server's log says it could not listen on
// its port: 'LOG:  could not bind IPv4 address "127.0.0.1": Address already
// in use', then 'FATAL:  could not create any TCP/IP sockets'.
func pgBindFailed(log string) bool { return strings.Contains(log, "could not bind") }

func appendConf(path string, settings [][2]string) error {
	var b strings.Builder
	b.WriteString("\n# outboxd test harness\n")
	for _, kv := range settings {
		fmt.Fprintf(&b, "%s = '%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", "''"))
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", path, err)
	}
	return nil
}

func externalPostgres(ctx context.Context, dsn string) (*Postgres, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", EnvPostgres, err)
	}
	p := &Postgres{extDSN: dsn, port: int(cfg.Port), adminDB: cfg.Database}
	if p.adminDB == "" {
		p.adminDB = "postgres"
	}
	if err := p.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("external postgres: %w", err)
	}
	return p, nil
}

// PostgresForTest starts a server (see StartPostgres) that is closed when
// the test and its subtests finish, even if the test panics. On failure the
// tail of the server log is added to the test output.
func PostgresForTest(t testing.TB, opts ...PGOption) *Postgres {
	t.Helper()
	return serverForTest(t, "postgres", 3*time.Minute, func(ctx context.Context) (*Postgres, error) { return StartPostgres(ctx, opts...) },
		func(p *Postgres) {
			if !p.External() {
				t.Logf("postgres log tail (%s):\n%s", p.LogFile(), p.logTail(8<<10))
			}
		})
}

// DSN returns a superuser DSN for database db.
func (p *Postgres) DSN(db string) string {
	if p.extDSN != "" {
		return rewriteDBName(p.extDSN, db)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, url.PathEscape(db))
}

// rewriteDBName replaces the database of a URL or keyword/value DSN.
func rewriteDBName(dsn, db string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		u.RawPath = ""
		return u.String()
	}
	// In keyword/value DSNs the last occurrence of a keyword wins.
	quoted := strings.ReplaceAll(strings.ReplaceAll(db, `\`, `\\`), `'`, `\'`)
	return dsn + " dbname='" + quoted + "'"
}

// Port is the TCP port the server listens on.
func (p *Postgres) Port() int { return p.port }

// Dir is the data directory ("" for an external server).
func (p *Postgres) Dir() string { return p.dataDir }

// LogFile is the server log ("" for an external server).
func (p *Postgres) LogFile() string {
	if p.ctr != nil {
		return p.dockerLogFile()
	}
	if p.dataDir == "" {
		return ""
	}
	return filepath.Join(p.dataDir, "postgres.log")
}

// External reports whether the server came from OUTBOXD_TEST_POSTGRES.
func (p *Postgres) External() bool { return p.extDSN != "" }

func (p *Postgres) errExternal(op string) error {
	return fmt.Errorf("postgres %s: not supported against an external server (%s)", op, EnvPostgres)
}

// Connect opens a superuser connection to database db.
func (p *Postgres) Connect(ctx context.Context, db string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, p.DSN(db))
	if err != nil {
		return nil, fmt.Errorf("connecting to database %q: %w", db, err)
	}
	return conn, nil
}

// Exec runs one statement in database db on a fresh connection.
func (p *Postgres) Exec(ctx context.Context, db, sql string, args ...any) error {
	conn, err := p.Connect(ctx, db)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("exec in %q: %w", db, err)
	}
	return nil
}
