package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// pgUser describes the OS user the PostgreSQL binaries run as. PostgreSQL
// refuses to run as root, so when the tests run as root the binaries run as
// the "postgres" OS user; otherwise they run as the current user (cred nil).
type pgUser struct {
	cred     *syscall.Credential
	uid, gid int
}

func lookupPGUser() (pgUser, error) {
	if os.Geteuid() != 0 {
		return pgUser{uid: os.Geteuid(), gid: os.Getegid()}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return pgUser{}, fmt.Errorf("running as root needs a %q OS user: %w", "postgres", err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return pgUser{}, fmt.Errorf("parsing uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return pgUser{}, fmt.Errorf("parsing gid %q: %w", u.Gid, err)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	return pgUser{cred: cred, uid: uid, gid: gid}, nil
}

// chown gives path to the PostgreSQL OS user (a no-op when not root).
func (u pgUser) chown(path string) error {
	if u.cred == nil {
		return nil
	}
	if err := os.Chown(path, u.uid, u.gid); err != nil {
		return fmt.Errorf("chown %s: %w", path, err)
	}
	return nil
}

// command builds a command that runs as the PostgreSQL OS user in dir, with
// PG* environment variables removed so they cannot redirect the binaries.
func (u pgUser) command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.cred}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	return cmd
}
