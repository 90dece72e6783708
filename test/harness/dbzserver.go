package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// DebeziumServerJava is the JDK Debezium Server runs on: the dist needs Java
// 21+, and the harness's Kafka JVMs use the system's Java 17.
const DebeziumServerJava = "/usr/lib/jvm/temurin-25-jdk-amd64/bin/java"

// DebeziumServerHome is the unpacked Debezium Server dist of
// DebeziumVersion, fetched and unpacked by .ci/debezium-server.sh (on
// demand here when the cache lacks it).
func DebeziumServerHome(ctx context.Context) (string, error) {
	base, home, runner, err := dbzServerPaths()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(runner); err == nil {
		return home, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, ".ci", "debezium-server.sh"))
	cmd.Env = append(os.Environ(), EnvKafkaCache+"="+base)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("debezium server %s is not in %s and .ci/debezium-server.sh failed: %w\n%s\nfix: run .ci/debezium-server.sh (Maven and Maven Central needed)", DebeziumVersion, home, err, tail(string(out), 2000))
	}
	if _, err := os.Stat(runner); err != nil {
		return "", fmt.Errorf("debezium server: .ci/debezium-server.sh left no %s", runner)
	}
	return home, nil
}

// DebeziumServerCached reports whether the dist is unpacked in the cache
// already (DebeziumServerHome would not fetch it).
func DebeziumServerCached() bool {
	_, _, runner, err := dbzServerPaths()
	if err != nil {
		return false
	}
	_, err = os.Stat(runner)
	return err == nil
}

// dbzServerPaths are the cache, the dist's directory in it and its runner jar.
func dbzServerPaths() (base, home, runner string, err error) {
	base = os.Getenv(EnvKafkaCache)
	if base == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return "", "", "", fmt.Errorf("debezium server: no cache dir (set %s): %w", EnvKafkaCache, err)
		}
		base = filepath.Join(dir, "outboxd")
	}
	home = filepath.Join(base, "debezium-server-"+DebeziumVersion)
	return base, home, filepath.Join(home, "debezium-server-dist-"+DebeziumVersion+"-runner.jar"), nil
}

// DebeziumServer is one Debezium Server JVM (the dist's runner jar, its lib/
// on the classpath) with an application.properties of its own temp dir,
// which also holds its offsets file and log. The JVM gets SIGKILL should the
// test process die (StartProc).
type DebeziumServer struct {
	dir  string
	proc *Proc
}

// StartDebeziumServer writes props (keys without a prefix: every one is
// written as given, debezium.source.*, debezium.sink.*, …) and starts the
// server with the Temurin 25 JDK and heap flags jvm. The offsets file is
// <dir>/offsets.dat: props may name it with OffsetsFile. It does not wait
// for the server to stream: the caller watches the slot or the broker.
func StartDebeziumServer(ctx context.Context, props map[string]string, jvm []string) (*DebeziumServer, error) {
	home, err := DebeziumServerHome(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(DebeziumServerJava); err != nil {
		return nil, fmt.Errorf("debezium server needs Java 21+: %s: %w\nfix: install the Temurin 25 JDK (apt-get install temurin-25-jdk)", DebeziumServerJava, err)
	}
	s := &DebeziumServer{}
	if s.dir, err = os.MkdirTemp("", "outboxd-dbzserver-"); err != nil {
		return nil, fmt.Errorf("debezium server: %w", err)
	}
	conf := filepath.Join(s.dir, "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		s.Close()
		return nil, err
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, propEscape(strings.ReplaceAll(props[k], "{dir}", s.dir)))
	}
	if err := os.WriteFile(filepath.Join(conf, "application.properties"), []byte(b.String()), 0o644); err != nil {
		s.Close()
		return nil, err
	}
	sep := string(os.PathListSeparator)
	cp := filepath.Join(home, "debezium-server-dist-"+DebeziumVersion+"-runner.jar") + sep + conf + sep + filepath.Join(home, "lib", "*")
	args := append(append([]string(nil), jvm...), "-cp", cp, "io.debezium.server.Main")
	// Quarkus reads config/application.properties of the working
	// directory: the process runs in s.dir.
	s.proc, err = startProcIn(ctx, "debezium-server", DebeziumServerJava, args, s.dir)
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// startProcIn is StartProc with the process's working directory at dir
// (its log there too).
func startProcIn(ctx context.Context, name, bin string, args []string, dir string) (*Proc, error) {
	// StartProc runs bin in the test's working directory; a shell hop
	// changes it and execs bin, so the pid is bin's.
	return StartProc(ctx, name, "bash", append([]string{"-c", `cd "$0" && exec "$@"`, dir, bin}, args...), nil, dir)
}

// OffsetsFile is the value to give debezium.source.offset.storage.file.filename.
const OffsetsFile = "{dir}/offsets.dat"

// Pid is the JVM's process id.
func (s *DebeziumServer) Pid() int { return s.proc.Pid() }

// Proc is the JVM's process (its log, whether it exited).
func (s *DebeziumServer) Proc() *Proc { return s.proc }

// Stop ends the JVM (SIGTERM, then SIGKILL after 20 s).
func (s *DebeziumServer) Stop() error {
	if s.proc == nil || s.proc.Exited() {
		return nil
	}
	return s.proc.Stop(20 * time.Second)
}

// Close stops the JVM and removes its directory.
func (s *DebeziumServer) Close() {
	if s.proc != nil && s.Stop() != nil {
		_ = s.proc.Kill()
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}
