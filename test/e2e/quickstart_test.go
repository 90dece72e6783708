package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// README's first screen, run as written: the sh blocks between the
// quickstart markers, in order, against a throwaway PostgreSQL (database
// app, the superuser for the setup, the role the setup creates for the
// relay) and a broker of the harness, with the binary on PATH as outboxd.
// The export lines are the only lines not run: the test sets those variables
// to its own servers. So the first screen cannot drift from what works.
func TestREADMEQuickstart(t *testing.T) {
	for _, tool := range []string{"bash", "psql", "kcat", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (bash .ci/run installs it): %v", tool, err)
		}
	}
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	i, j := strings.Index(text, "<!-- quickstart:begin"), strings.Index(text, "<!-- quickstart:end -->")
	if i < 0 || j < i {
		t.Fatal("README.md has no quickstart:begin … quickstart:end block")
	}
	section := text[i:j]
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) < 6 {
		t.Fatalf("%d sh blocks in the quickstart, want the exports, setup, run, insert, read and check", len(blocks))
	}
	prints := regexp.MustCompile("which prints `([^`]+)`").FindStringSubmatch(section)
	if prints == nil {
		t.Fatal("the quickstart does not say what kcat prints")
	}

	pg := harness.PostgresForTest(t)
	if pg.External() {
		t.Skip("creates a role and a slot named outboxd: needs its own server")
	}
	kafka := harness.KafkaForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	adminURL, err := pg.NewDatabase(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	binDir := t.TempDir()
	if err := os.Symlink(outboxdBin, filepath.Join(binDir, "outboxd")); err != nil {
		t.Fatal(err)
	}
	httpAddr := harness.FreeAddr(t)
	env := append(os.Environ(),
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"ADMIN_URL="+adminURL,
		"OUTBOXD_POSTGRES="+strings.Replace(adminURL, "postgres://postgres@", "postgres://outboxd@", 1),
		"OUTBOXD_KAFKA_BROKERS="+strings.Join(kafka.Brokers(), ","),
		"OUTBOXD_HTTP_ADDR="+httpAddr,
	)
	for _, v := range []string{"ADMIN_URL", "OUTBOXD_POSTGRES", "OUTBOXD_KAFKA_BROKERS"} {
		if !strings.Contains(blocks[0], "export "+v+"=") {
			t.Fatalf("the first block does not export %s:\n%s", v, blocks[0])
		}
	}
	sh := func(block string) (string, error) {
		bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(bctx, "bash", "-euo", "pipefail", "-c", strings.ReplaceAll(block, "127.0.0.1:9187", httpAddr))
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for n, block := range blocks[1:] {
		first := strings.TrimSpace(strings.SplitN(block, "\n", 2)[0])
		switch {
		case strings.HasPrefix(command(first), "outboxd run"):
			line, _, _ := strings.Cut(first, "#")
			words := strings.Fields(line)
			// Leading NAME=value words (the password step) go to its environment.
			procEnv := append([]string(nil), env[len(env)-5:]...)
			for len(words) > 0 && strings.Contains(words[0], "=") {
				procEnv = append(procEnv, strings.ReplaceAll(words[0], "'", ""))
				words = words[1:]
			}
			ob, err := harness.StartProc(ctx, "outboxd", outboxdBin, words[1:], procEnv, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ob.Stop(20 * time.Second) })
			if err := harness.WaitStreaming(ctx, ob, httpAddr); err != nil {
				t.Fatalf("block %d, %q: %v\n%s", n+1, first, err, ob.Log())
			}
			if strings.Contains(ob.Log(), "insecure transport") {
				t.Errorf("a loopback trial warned about its transport:\n%s", ob.Log())
			}
		case strings.Contains(block, "kcat -C"):
			// Run once, right after the INSERT: the block itself must wait
			// for the topic outboxd creates a moment later (a bare kcat -C
			// races it and fails with "Unknown topic or partition").
			want := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(prints[1]), "…", ".*") + "$")
			out, err := sh(block)
			if err != nil || !want.MatchString(strings.TrimSpace(out)) {
				t.Fatalf("block %d, %q: %v; output %q, README says it prints %q", n+1, first, err, out, prints[1])
			}
		default:
			out, err := sh(block)
			if err != nil {
				t.Fatalf("block %d:\n%s\nfailed: %v\n%s", n+1, block, err, out)
			}
			t.Logf("block %d:\n%s→\n%s", n+1, block, out)
			switch {
			case strings.HasPrefix(first, "psql"):
				if !strings.Contains(out, "INSERT 0 1") {
					t.Errorf("insert: %s", out)
				}
			case strings.HasPrefix(first, "curl"):
				if !strings.HasPrefix(out, "ok\n") || !strings.Contains(out, "* outboxd") || !strings.Contains(out, "public.outbox") {
					t.Errorf("check: want /readyz ok and the slot and table in outboxd status:\n%s", out)
				}
			}
		}
	}
}

// command is a shell line without its leading NAME=value assignments.
func command(line string) string {
	words := strings.Fields(line)
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
		words = words[1:]
	}
	return strings.Join(words, " ")
}
