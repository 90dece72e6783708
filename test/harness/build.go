package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// builds caches BuildBinary results for the life of the test process.
var builds = struct {
	mu   sync.Mutex
	bins map[string]string
}{bins: map[string]string{}}

// BuildBinary builds the main package pkg (relative to the module root, e.g.
// "./cmd/outboxd") once per process and returns the binary's path. Binaries
// go to a per-module directory under the OS temp dir and are replaced
// atomically, so concurrent test processes can share it.
func BuildBinary(ctx context.Context, pkg string) (string, error) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if bin, ok := builds.bins[pkg]; ok {
		return bin, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(root + "\x00" + pkg))
	dir := filepath.Join(os.TempDir(), "outboxd-testbin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	bin := filepath.Join(dir, filepath.Base(pkg)+"-"+hex.EncodeToString(sum[:6]))
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	builds.bins[pkg] = bin
	return bin, nil
}

// ModuleRoot walks up from the working directory to the directory holding
// go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("finding module root: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding module root: no go.mod above the working directory")
		}
		dir = parent
	}
}
