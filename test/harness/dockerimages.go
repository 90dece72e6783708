package harness

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Local images stand in for registry images where no registry is
// reachable. Each tag carries a hash of everything the image is made from,
// so an image is built once per machine and rebuilt only when its recipe
// (or the Go toolchain, or kfaked's code) changes.
const localRepo = "outboxd-test/"

// images caches resolved image names for the life of the test process.
var images = struct {
	mu   sync.Mutex
	tags map[string]string
}{tags: map[string]string{}}

// DockerCLI runs the docker client with args and returns its combined
// output; the error names the command and includes the output.
func DockerCLI(ctx context.Context, args ...string) (string, error) {
	return dockerCLIStdin(ctx, nil, args...)
}

func dockerCLIStdin(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// CheckDocker returns an actionable error if no Docker engine answers.
func CheckDocker(ctx context.Context) error {
	if _, err := exec.LookPath("docker"); err != nil {
		return errors.New("docker client not found: install Docker (on Debian: bash .ci/docker.sh installs docker.io and starts dockerd)")
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		return fmt.Errorf("no Docker engine answers (%v: %s): start one, e.g. bash .ci/docker.sh (installs docker.io, starts dockerd with host networking)", err, bytes.TrimSpace(out))
	}
	return nil
}

func imageExists(ctx context.Context, ref string) bool {
	return exec.CommandContext(ctx, "docker", "image", "inspect", "--format", "{{.Id}}", ref).Run() == nil
}

// ensureImage returns tag, building it with build (under a machine-wide
// lock, so parallel test processes build it once) unless it exists.
func ensureImage(ctx context.Context, tag string, build func(context.Context, string) error) (string, error) {
	images.mu.Lock()
	defer images.mu.Unlock()
	if images.tags[tag] != "" {
		return tag, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(os.TempDir(), "outboxd-docker-images.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if !imageExists(ctx, tag) {
		start := time.Now()
		if err := build(ctx, tag); err != nil {
			return "", fmt.Errorf("building local image %s: %w", tag, err)
		}
		fmt.Fprintf(os.Stderr, "harness: built local image %s in %s\n", tag, time.Since(start).Round(time.Second))
		removeStale(ctx, tag)
	}
	images.tags[tag] = tag
	return tag, nil
}

// removeStale untags older builds of the same image (same repository,
// tag up to the hash), so that recipe changes do not pile up images.
func removeStale(ctx context.Context, tag string) {
	repo, version, _ := strings.Cut(tag, ":")
	prefix := version[:strings.LastIndex(version, "-")+1] // "" for hash-only tags
	out, err := DockerCLI(ctx, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repo)
	if err != nil {
		return
	}
	for _, old := range strings.Fields(out) {
		if old != tag && strings.HasPrefix(old, repo+":"+prefix) {
			_, _ = DockerCLI(ctx, "rmi", old) // fails harmlessly if a container uses it
		}
	}
}

// lockFile takes an exclusive flock on path, polling until ctx ends.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, fmt.Errorf("image build lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("image build lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for image build lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func contentHash(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d\x00", len(p))
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// OfficialOrLocal returns official if it is present or can be pulled, and
// otherwise the local stand-in that local builds. The result is cached per
// process, so an unreachable registry costs one failed pull.
func OfficialOrLocal(ctx context.Context, official string, local func(context.Context) (string, error)) (string, error) {
	key := "official:" + official
	images.mu.Lock()
	resolved := images.tags[key]
	images.mu.Unlock()
	if resolved == "" {
		resolved = "-"
		pullCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		if imageExists(ctx, official) {
			resolved = official
		} else if _, err := DockerCLI(pullCtx, "pull", "--quiet", official); err == nil {
			resolved = official
		}
		cancel()
		images.mu.Lock()
		images.tags[key] = resolved
		images.mu.Unlock()
	}
	if resolved != "-" {
		return resolved, nil
	}
	return local(ctx)
}

// PostgresImage is the image the docker backend runs PostgreSQL from: the
// official postgres:15 where it can be had, else LocalPostgresImage.
func PostgresImage(ctx context.Context) (string, error) {
	if img := os.Getenv("OUTBOXD_TEST_POSTGRES_IMAGE"); img != "" {
		return img, nil
	}
	return OfficialOrLocal(ctx, "postgres:15", LocalPostgresImage)
}

// LocalPostgresImage is a Debian bookworm root filesystem made by
// debootstrap with postgresql-15, and an entrypoint that does what the
// official postgres image's does for outboxd's tests and compose file
// (POSTGRES_USER/PASSWORD/DB/HOST_AUTH_METHOD, /docker-entrypoint-initdb.d
// *.sql, then exec of the command). It needs root and debootstrap, and takes
// about a minute and a half to build.
func LocalPostgresImage(ctx context.Context) (string, error) {
	tag := localRepo + "postgres:15-bookworm-" + contentHash([]byte(rootfsScript), []byte(pgEntrypoint))
	return ensureImage(ctx, tag, func(ctx context.Context, tag string) error {
		if os.Geteuid() != 0 {
			return errors.New("debootstrap needs root: run as root, or set OUTBOXD_TEST_POSTGRES_IMAGE to a postgres image")
		}
		if _, err := exec.LookPath("debootstrap"); err != nil {
			return errors.New("debootstrap not found: apt-get install debootstrap (bash .ci/docker.sh does)")
		}
		dir, err := os.MkdirTemp("", "outboxd-rootfs-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		entry := filepath.Join(dir, "docker-entrypoint.sh")
		if err := os.WriteFile(entry, []byte(pgEntrypoint), 0o755); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, "bash", "-c", rootfsScript, "rootfs", tag, entry)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w\n%s", err, out)
		}
		return nil
	})
}

// rootfsScript makes the bookworm root filesystem and imports it as $1.
// The mirror is the one apt uses (DEBIAN_MIRROR overrides it).
const rootfsScript = `set -euo pipefail
tag=$1 entry=$2
mirror=${DEBIAN_MIRROR:-$(grep -ohsE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources | head -n1 | tr -d ' ' || true)}
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d) log=$(mktemp)
trap 'rm -rf "$root" "$log"' EXIT
if ! debootstrap --variant=minbase --include=postgresql-15,ca-certificates bookworm "$root" "$mirror" >"$log" 2>&1; then
  tail -n 40 "$log" >&2; exit 1
fi
# The package's own cluster, caches and docs are not wanted in an image.
rm -rf "$root"/var/lib/postgresql/15/main "$root"/etc/postgresql/15/main \
  "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale/*
install -m 0755 "$entry" "$root"/usr/local/bin/docker-entrypoint.sh
mkdir -p "$root"/docker-entrypoint-initdb.d
tar -C "$root" --numeric-owner -cf - . | docker import \
  --change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV PGDATA=/var/lib/postgresql/data' --change 'ENV LANG=C.UTF-8' \
  --change 'ENTRYPOINT ["docker-entrypoint.sh"]' --change 'CMD ["postgres"]' \
  --change 'EXPOSE 5432' - "$tag-rootfs" >/dev/null
# docker import cannot set STOPSIGNAL; SIGINT is a fast shutdown.
printf 'FROM %s\nSTOPSIGNAL SIGINT\n' "$tag-rootfs" | docker build --network host -q -t "$tag" - >/dev/null
docker rmi "$tag-rootfs" >/dev/null
`

// pgEntrypoint mirrors the official image's docker-entrypoint.sh for what
// outboxd uses. STOPSIGNAL SIGINT (fast shutdown) matches it too.
const pgEntrypoint = `#!/bin/sh
# Stand-in for the official postgres image's entrypoint (outboxd tests).
set -eu
export PGDATA="${PGDATA:-/var/lib/postgresql/data}"
if [ "${1#-}" != "$1" ]; then set -- postgres "$@"; fi
if [ "$1" != postgres ]; then exec "$@"; fi
if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	user="${POSTGRES_USER:-postgres}"
	db="${POSTGRES_DB:-$user}"
	pwfile=$(mktemp)
	printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
	if [ -n "${POSTGRES_PASSWORD:-}" ]; then pwopt="--pwfile=$pwfile"; else pwopt=; fi
	initdb -D "$PGDATA" --username="$user" $pwopt ${POSTGRES_INITDB_ARGS:-} >/dev/null
	rm -f "$pwfile"
	printf '\nhost all all all %s\n' "${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >>"$PGDATA/pg_hba.conf"
	# Like the official image: a temporary server on the Unix socket only, so
	# that TCP health checks pass only once initialisation is done.
	pg_ctl -D "$PGDATA" -w -o "-c listen_addresses= -c unix_socket_directories=/var/run/postgresql" start >/dev/null
	export PGHOST=/var/run/postgresql PGUSER="$user"
	if [ "$db" != postgres ]; then psql -v ON_ERROR_STOP=1 -q -d postgres -c "CREATE DATABASE \"$db\""; fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sql) echo "docker-entrypoint.sh: running $f"; psql -v ON_ERROR_STOP=1 -q -d "$db" -f "$f" ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
	unset PGHOST PGUSER
fi
exec "$@"
`

// GoBuilderImage is a builder base for deploy/Dockerfile's BUILDER_IMAGE: the
// local bookworm image with this machine's Go toolchain at /usr/local/go
// (GOPATH /go, GOTOOLCHAIN local, like the official golang image) and this
// machine's CA bundle, so that the build reaches the module proxy the way
// the machine does (a TLS-intercepting proxy's CA included).
func GoBuilderImage(ctx context.Context) (string, error) {
	base, err := LocalPostgresImage(ctx)
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOROOT: %w", err)
	}
	goroot := strings.TrimSpace(string(out))
	version, err := os.ReadFile(filepath.Join(goroot, "VERSION"))
	if err != nil {
		return "", fmt.Errorf("go builder image: reading the toolchain version: %w", err)
	}
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return "", fmt.Errorf("go builder image needs the CA bundle: %w (apt-get install ca-certificates)", err)
	}
	withGo := "FROM " + base + `
COPY . /usr/local/go
ENV GOPATH=/go GOTOOLCHAIN=local PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENTRYPOINT []
CMD ["bash"]
`
	ver, _, _ := strings.Cut(strings.TrimPrefix(string(version), "go"), "\n")
	tag := localRepo + "golang:" + ver + "-" + contentHash([]byte(withGo), version, ca)
	return ensureImage(ctx, tag, func(ctx context.Context, tag string) error {
		if _, err := dockerCLIStdin(ctx, []byte(withGo), "build", "--network", "host", "-q", "-t", tag+"-goroot", "-f", "-", goroot); err != nil {
			return err
		}
		defer DockerCLI(context.WithoutCancel(ctx), "rmi", tag+"-goroot")
		dir, err := os.MkdirTemp("", "outboxd-builder-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := os.WriteFile(filepath.Join(dir, "ca-certificates.crt"), ca, 0o644); err != nil {
			return err
		}
		withCA := "FROM " + tag + "-goroot\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
		_, err = dockerCLIStdin(ctx, []byte(withCA), "build", "--network", "host", "-q", "-t", tag, "-f", "-", dir)
		return err
	})
}

// caBundle is the machine's CA bundle (Debian's path).
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// nonrootFiles are the files of distroless/static's nonroot variant that a
// static Go binary needs: users (nonroot = 65532), CA certificates, /tmp.
func nonrootFiles() ([]tarEntry, error) {
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return nil, fmt.Errorf("runtime base image needs the CA bundle: %w (apt-get install ca-certificates)", err)
	}
	return []tarEntry{
		{name: "etc/", mode: 0o755},
		{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, body: ca},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: 65532},
		{name: "tmp/", mode: 0o1777},
	}, nil
}

// RuntimeImage is a runtime base for deploy/Dockerfile's RUNTIME_IMAGE: a
// scratch image with distroless/static:nonroot's users, CA bundle and /tmp.
func RuntimeImage(ctx context.Context) (string, error) {
	files, err := nonrootFiles()
	if err != nil {
		return "", err
	}
	tarball, err := makeTar(files)
	if err != nil {
		return "", err
	}
	tag := localRepo + "static-nonroot:" + contentHash(tarball)
	return ensureImage(ctx, tag, func(ctx context.Context, tag string) error {
		_, err := dockerCLIStdin(ctx, tarball, "import", "--change", "USER 65532:65532", "-", tag)
		return err
	})
}

// KfakedImage is a scratch image with a static test/cmd/kfaked as its
// entrypoint, running as 65532 by default, with its data under /data
// (writable by any user: the harness runs it as the test's user).
func KfakedImage(ctx context.Context) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "outboxd-kfaked-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "kfaked")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./test/cmd/kfaked")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building static kfaked: %w\n%s", err, out)
	}
	body, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	files, err := nonrootFiles()
	if err != nil {
		return "", err
	}
	files = append(files, tarEntry{name: "kfaked", mode: 0o755, body: body}, tarEntry{name: "data/", mode: 0o1777})
	tarball, err := makeTar(files)
	if err != nil {
		return "", err
	}
	tag := localRepo + "kfaked:" + contentHash(tarball)
	return ensureImage(ctx, tag, func(ctx context.Context, tag string) error {
		_, err := dockerCLIStdin(ctx, tarball, "import", "--change", "USER 65532:65532", "--change", `ENTRYPOINT ["/kfaked"]`, "-", tag)
		return err
	})
}

type tarEntry struct {
	name string // a trailing slash makes a directory
	mode int64
	uid  int
	body []byte
}

// makeTar writes entries with fixed times, so equal content hashes equal.
func makeTar(entries []tarEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: mtime, Format: tar.FormatPAX}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
