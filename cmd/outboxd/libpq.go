package main

import (
	"strings"
)

// libpq's environment variables that say where to connect, and the
// connection-string keyword each stands for. With --postgres unset, psql
// connects where these say; so does outboxd. PGPASSWORD and PGPASSFILE are
// not copied: the driver (pgx) reads them itself, so a password never enters
// the connection string (or ps, or a log line).
var libpqVars = []struct{ env, keyword string }{
	{"PGHOST", "host"}, {"PGHOSTADDR", "hostaddr"}, {"PGPORT", "port"}, {"PGDATABASE", "dbname"}, {"PGUSER", "user"},
	{"PGSERVICE", "service"}, {"PGSERVICEFILE", "servicefile"},
	{"PGSSLMODE", "sslmode"}, {"PGSSLROOTCERT", "sslrootcert"}, {"PGSSLCERT", "sslcert"}, {"PGSSLKEY", "sslkey"},
	{"PGCONNECT_TIMEOUT", "connect_timeout"}, {"PGTARGETSESSIONATTRS", "target_session_attrs"}, {"PGAPPNAME", "application_name"},
}

// orLibpq is dsn, or with dsn empty the connection string libpq's PG*
// variables describe: with --postgres unset, outboxd connects where psql would.
func orLibpq(dsn string, getenv func(string) string) string {
	if dsn == "" {
		return libpqDSN(getenv)
	}
	return dsn
}

// libpqDSN is the keyword/value connection string the PG* variables describe,
// or "" when none of those naming a server, database, user or service is set
// (PGPASSWORD alone, or PGSSLMODE alone, is not a place to connect to).
func libpqDSN(getenv func(string) string) string {
	var parts []string
	where := false
	for _, v := range libpqVars {
		val := getenv(v.env)
		if val == "" {
			continue
		}
		switch v.env {
		case "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE":
			where = true
		}
		parts = append(parts, v.keyword+"="+quoteKeywordValue(val))
	}
	if !where {
		return ""
	}
	return strings.Join(parts, " ")
}

// quoteKeywordValue quotes a value for a keyword/value connection string as
// libpq reads it: single quotes, with backslash and quote escaped.
func quoteKeywordValue(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
