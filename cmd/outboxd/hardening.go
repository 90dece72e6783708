package main

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/pgsql"
)

// Startup checks of how outboxd is exposed: the transport to PostgreSQL,
// who else may publish through it, and where its secrets come from. They
// warn (or refuse) once, at startup, naming the fix.

// readPostgresFile returns the connection string kept in a file, so that a
// password never shows in ps or /proc/<pid>/cmdline. Surrounding blank lines
// and spaces are ignored.
func readPostgresFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--postgres-file: %w", err)
	}
	dsn := strings.TrimSpace(string(b))
	if dsn == "" {
		return "", fmt.Errorf("--postgres-file: %s is empty", path)
	}
	return dsn, nil
}

// postgresFileFlag is --postgres-file for the one-shot commands: setting it
// reads the file into their --postgres.
type postgresFileFlag struct{ dsn *string }

func (f postgresFileFlag) String() string { return "" }

func (f postgresFileFlag) Set(path string) error {
	dsn, err := readPostgresFile(path)
	if err != nil {
		return err
	}
	*f.dsn = dsn
	return nil
}

// registerPostgresFile adds --postgres-file, filling dsn.
func registerPostgresFile(s *optionSet, dsn *string) {
	s.fs.Var(postgresFileFlag{dsn}, "postgres-file", "file holding the PostgreSQL connection string, instead of --postgres (keeps a password out of ps)")
}

// transportWarnings lists what is weaker than verify-full, for the log and
// /status.
func transportWarnings(o runOptions, getenv func(string) string) []string {
	var out []string
	if mode := pgsql.SSLMode(o.Postgres, getenv); mode != "verify-full" && mode != "socket" && !o.PostgresAllowInsecure && crossesNetwork(o.Postgres) {
		out = append(out, fmt.Sprintf("PostgreSQL sslmode is %s: the connection (events, and the password) can be read or altered on the network, "+
			"and the server is not authenticated; use sslmode=verify-full&sslrootcert=<CA file> (or --postgres-allow-insecure to accept this)", mode))
	}
	return out
}

// crossesNetwork reports whether a connection string names a host other than
// the loopback interface or a Unix socket: only then can a weak sslmode be
// read or altered by anyone else. A string that does not parse names no host
// at all (the connection attempt reports that), so nothing is warned about.
func crossesNetwork(dsn string) bool {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return false
	}
	hosts := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	for _, h := range hosts {
		if strings.HasPrefix(h, "/") || h == "localhost" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
			continue
		}
		return true
	}
	return false
}
