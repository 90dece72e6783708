package harness

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ApicurioVersion is the Apicurio Registry test/apicurio/pom.xml builds
// (its parent's version; the pom says why not 3.x).
const ApicurioVersion = "2.4.2.Final"

// EnvApicurioJava names the java binary that runs Apicurio (Java 17+);
// default: ApicurioJava's search.
const EnvApicurioJava = "OUTBOXD_APICURIO_JAVA"

// ApicurioApp returns the runner jar (its lib/ beside it) that
// .ci/apicurio.sh builds into the harness's cache from
// test/apicurio/pom.xml. The build takes a while, so the harness does not
// run it itself: a missing app is an error naming the script.
func ApicurioApp() (string, error) {
	base := os.Getenv(EnvKafkaCache)
	if base == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("apicurio: no cache dir (set %s): %w", EnvKafkaCache, err)
		}
		base = filepath.Join(dir, "outboxd")
	}
	jar := filepath.Join(base, "apicurio-"+ApicurioVersion, "app", "outboxd-apicurio-runner.jar")
	if _, err := os.Stat(jar); err != nil {
		return "", fmt.Errorf("Apicurio Registry %s is not built (%s is missing): run .ci/apicurio.sh (Maven, Java 17+)", ApicurioVersion, jar)
	}
	return jar, nil
}

// ApicurioJava returns a java of version 17 or later: $OUTBOXD_APICURIO_JAVA,
// or java in PATH if it is one.
func ApicurioJava() (string, error) {
	if j := os.Getenv(EnvApicurioJava); j != "" {
		return j, nil
	}
	if j, err := exec.LookPath("java"); err == nil {
		if out, err := exec.Command(j, "-version").CombinedOutput(); err == nil && javaMajor(string(out)) >= 17 {
			return j, nil
		}
	}
	return "", fmt.Errorf("apicurio needs Java 17 or later in PATH (.ci/kafka.sh installs it) or %s", EnvApicurioJava)
}

// javaMajor reads the major version from `java -version`'s `version "21.0.2"`.
func javaMajor(out string) int {
	var major int
	for i := 0; i+9 < len(out); i++ {
		if out[i:i+9] == `version "` {
			s := out[i+9:]
			j := 0
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			major, _ = strconv.Atoi(s[:j])
			break
		}
	}
	return major
}

// Apicurio is one Apicurio Registry JVM on 127.0.0.1 with SQL storage in an
// H2 file of its temp dir, so that Stop and Start keep the schemas and their
// ids (a registry outage, not a new registry). A reaper child kills the JVM
// and removes the dir should the test process die without cleaning up.
type Apicurio struct {
	app, java, dir string // app: the runner jar
	port           int

	mu     sync.Mutex
	proc   *Proc
	reaper *jvmReaper
}

// StartApicurio starts Apicurio Registry and waits until its
// Confluent-compatible API answers. Close it when done.
func StartApicurio(ctx context.Context) (*Apicurio, error) {
	a := &Apicurio{}
	var err error
	if a.app, err = ApicurioApp(); err != nil {
		return nil, err
	}
	if a.java, err = ApicurioJava(); err != nil {
		return nil, err
	}
	if a.dir, err = os.MkdirTemp("", "outboxd-apicurio-"); err != nil {
		return nil, fmt.Errorf("apicurio: %w", err)
	}
	if a.reaper, err = startJVMReaper("outboxd-apicurio-reaper", a.dir); err != nil {
		os.RemoveAll(a.dir)
		return nil, err
	}
	// The JVM binds its port a second or more after FreePort let it go: a
	// server another test started meanwhile may take it (make test runs
	// suites side by side), so a start refused for the port is tried again
	// on a new one.
	if err := onFreePort(ctx, &a.port, func() error { return a.Start(ctx) }, portInUse); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// portInUse reports whether a failed Quarkus start says its port was taken.
func portInUse(err error) bool {
	return strings.Contains(err.Error(), "seems to be in use by another process")
}

// ApicurioForTest is StartApicurio for one test, skipping it (with the
// reason) when the registry is not built here; closed when the test ends,
// with its log tail in a failed test's output.
func ApicurioForTest(t testing.TB) *Apicurio {
	t.Helper()
	if _, err := ApicurioApp(); err != nil {
		t.Skip(err)
	}
	if _, err := ApicurioJava(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, err := StartApicurio(ctx)
	if err != nil {
		t.Fatalf("starting apicurio: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("apicurio log tail (%s):\n%s", a.LogFile(), fileTail(a.LogFile(), 8<<10))
		}
		a.Close()
	})
	return a
}

// Start starts the registry (again, after Stop: same storage, same port)
// and waits until its API answers.
func (a *Apicurio) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil && !a.proc.Exited() {
		return nil
	}
	args := append([]string(nil), jvmFlags...)
	args = append(args, "-Dquarkus.profile=prod",
		"-Dquarkus.http.host=127.0.0.1", "-Dquarkus.http.port="+strconv.Itoa(a.port),
		"-jar", a.app)
	// An H2 file, not the default in-memory database: the schemas and their
	// ids outlive Stop.
	env := []string{"REGISTRY_DATASOURCE_URL=jdbc:h2:file:" + filepath.Join(a.dir, "registry")}
	proc, err := StartProc(ctx, "apicurio", a.java, args, env, a.dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(a.dir, "apicurio.pid"), []byte(strconv.Itoa(proc.Pid())), 0o644); err != nil {
		_ = proc.Kill()
		return fmt.Errorf("apicurio: %w", err)
	}
	a.proc = proc
	return a.waitReady(ctx, proc)
}

func (a *Apicurio) waitReady(ctx context.Context, proc *Proc) error {
	last := "no answer"
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, a.URL()+"/subjects", nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if proc.Exited() {
			code, _ := proc.Wait(ctx)
			return fmt.Errorf("apicurio exited (code %d); log tail:\n%s", code, fileTail(proc.LogPath(), 6<<10))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apicurio not ready: %w (last: %s); log tail:\n%s", ctx.Err(), last, fileTail(proc.LogPath(), 4096))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop stops the JVM (SIGTERM): the registry is down until Start.
func (a *Apicurio) Stop() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc == nil || a.proc.Exited() {
		return nil
	}
	return stopJVM(a.proc)
}

// URL is the base of the Confluent-compatible API (ccompat v7), what
// --schema-registry-url and sr.URLs take.
func (a *Apicurio) URL() string { return fmt.Sprintf("http://127.0.0.1:%d/apis/ccompat/v7", a.port) }

// RegistryURL is the base of the registry's own API (v2), what Apicurio's
// Kafka serdes and Connect converters take (apicurio.registry.url).
func (a *Apicurio) RegistryURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d/apis/registry/v2", a.port)
}

// LogFile is the registry's output.
func (a *Apicurio) LogFile() string { return filepath.Join(a.dir, "apicurio.log") }

// Close kills the JVM and removes its directory.
func (a *Apicurio) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil && !a.proc.Exited() {
		_ = a.proc.Kill()
	}
	a.reaper.close()
	if a.dir != "" {
		_ = os.RemoveAll(a.dir)
	}
}
