package harness

import (
	"os"
	"path/filepath"
)

// EnvPGBin names the environment variable holding the directory of the
// PostgreSQL server binaries (initdb, pg_ctl, postgres) the harness runs;
// empty means the ones on PATH. `make test` points it at each tested major
// version in turn.
const EnvPGBin = "OUTBOXD_TEST_PG_BIN"

// pgBinary is the path of one PostgreSQL server program.
func pgBinary(name string) string {
	if dir := os.Getenv(EnvPGBin); dir != "" {
		return filepath.Join(dir, name)
	}
	return name
}
