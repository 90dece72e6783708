package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// Active/standby faults: two outboxd instances on the slot (scenario.standby).
const (
	faultHAKill faultKind = "ha-kill" // SIGKILL the active; the standby takes over; a new standby starts
	faultHAStop faultKind = "ha-stop" // SIGSTOP the active (a silent partition of the process); the standby cuts it off and takes over; SIGCONT: it becomes the standby
)

// haTakeoverBound is how fast a standby must take over once the active's
// connection closed (ha-kill).
const haTakeoverBound = 2 * time.Second

// TestFaultsHA runs an active and a standby outboxd under load: the active
// is SIGKILLed and SIGSTOPped, the walsender killed, PostgreSQL and the
// broker restarted; the standby takes over each time and nothing is lost.
func TestFaultsHA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a broker and two outboxd (-short)")
	}
	sc := scenario{
		name: "ha",
		load: loadConfig{
			writers: 3, pauseMin: 100 * time.Millisecond, pauseMax: 250 * time.Millisecond,
			pBulk: 0.02, pTen: 0.35, bulkSize: 500,
			pRollback: 0.1, pInsertDelete: 0.1,
			aggTypes: aggTypes, aggIDs: 12, maxPad: 200, pSlowCommit: 0.2,
		},
		faults: []faultKind{faultHAKill, faultWalsenderKill, faultHAStop, faultHAKill, faultBrokerStop, faultPGRestart, faultHAKill},
		// A SIGSTOPped active is cut off once its client has been silent
		// for --replication-timeout: the standby terminates its walsender.
		// Both run as the `setup --role` role, whose pg_read_all_stats
		// lets a standby see that silence (docs/ha.md);
		// the spread keeps them together for several timeouts.
		relayArgs:   []string{"--replication-timeout", "4s"},
		standby:     true,
		setupRole:   "outboxd_fault_ha",
		spread:      22 * time.Second,
		warmup:      2 * time.Second,
		cooldown:    2 * time.Second,
		catchUp:     60 * time.Second,
		settleBound: 45 * time.Second,
	}
	w := newWorld(t, sc, mode(t), seed())
	w.run()
}

// role is the outboxd's /status role ("" if it does not answer).
func (w *world) role(p *harness.Proc) string {
	w.relayMu.Lock()
	addr := w.httpAddr[p]
	w.relayMu.Unlock()
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + addr + "/status")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var st struct {
		Role string `json:"role"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return ""
	}
	return st.Role
}

// waitRole polls every 10 ms until p has role, within bound.
func (w *world) waitRole(p *harness.Proc, role string, bound time.Duration) (time.Duration, error) {
	start := time.Now()
	for w.role(p) != role {
		if p.Exited() {
			return time.Since(start), fmt.Errorf("outboxd exited while waiting for role %s; log tail:\n%s", role, tailString(p.Log(), 2000))
		}
		if time.Since(start) > bound || w.ctx.Err() != nil {
			return time.Since(start), fmt.Errorf("outboxd not %s within %v (role %q)", role, bound, w.role(p))
		}
		sleepCtx(w.ctx, 10*time.Millisecond)
	}
	return time.Since(start), nil
}

// startStandby starts the second instance and waits until it stands by.
func (w *world) startStandby() error {
	p, err := w.spawnRelay()
	if err != nil {
		return err
	}
	w.relayMu.Lock()
	w.standby = p
	w.relayMu.Unlock()
	_, err = w.waitRole(p, "standby", 60*time.Second)
	return err
}

// stopStandby ends the standby with SIGTERM; it must exit 0 at once.
func (w *world) stopStandby() {
	w.relayMu.Lock()
	p := w.standby
	w.relayMu.Unlock()
	if p == nil {
		return
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		w.errs = append(w.errs, "standby stop: "+err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(w.ctx, relayShutdownTimeout+termSlack)
	defer cancel()
	if code, err := p.Wait(ctx); err != nil || code != 0 {
		w.errs = append(w.errs, fmt.Sprintf("standby stop: exit code %d, err %v", code, err))
	}
}

// injectHA runs an active/standby fault. Which instance is active can
// change with any fault (after a walsender kill the standby may win the
// slot), so it is asked first.
func (w *world) injectHA(kind faultKind) (string, error) {
	if !w.sc.standby {
		return "", fmt.Errorf("%s needs scenario.standby", kind)
	}
	w.relayMu.Lock()
	a, s := w.relay, w.standby
	w.relayMu.Unlock()
	if s.Exited() {
		code, _ := s.Wait(w.ctx)
		w.unexpectedExits = append(w.unexpectedExits, fmt.Sprintf("standby outboxd exited by itself with code %d; log tail:\n%s", code, tailString(s.Log(), 3000)))
		return "", w.startStandby()
	}
	if w.role(a) != "active" {
		if _, err := w.waitRole(s, "active", 10*time.Second); err != nil {
			return "", fmt.Errorf("no active instance: %w", err)
		}
		a, s = s, a
	}
	if _, err := w.waitRole(s, "standby", 30*time.Second); err != nil {
		return "", fmt.Errorf("no standby before the fault: %w", err)
	}
	var detail string
	switch kind {
	case faultHAKill:
		if err := a.Kill(); err != nil {
			return "", err
		}
		took, err := w.waitRole(s, "active", 10*time.Second)
		if err != nil {
			return "", err
		}
		detail = fmt.Sprintf("takeover %v", took.Round(time.Millisecond))
		if took > haTakeoverBound {
			w.errs = append(w.errs, fmt.Sprintf("ha-kill: the standby took over after %v, want ≤ %v", took, haTakeoverBound))
		}
		w.relayMu.Lock()
		w.relay = s
		w.relayMu.Unlock()
		if err := w.startStandby(); err != nil {
			return detail, err
		}
	case faultHAStop:
		if err := a.Signal(syscall.SIGSTOP); err != nil {
			return "", err
		}
		took, err := w.waitRole(s, "active", 60*time.Second)
		if e := a.Signal(syscall.SIGCONT); err == nil {
			err = e
		}
		if err != nil {
			return "", err
		}
		detail = fmt.Sprintf("takeover %v", took.Round(time.Millisecond))
		// Resumed, it finds its walsender gone and stands by.
		if _, err := w.waitRole(a, "standby", 60*time.Second); err != nil {
			return detail, fmt.Errorf("the resumed instance: %w", err)
		}
		w.relayMu.Lock()
		w.relay, w.standby = s, a
		w.relayMu.Unlock()
	}
	return detail, nil
}

// asSetupRole creates role with `outboxd setup --role --no-slot` and points
// outboxd's DSN at it; the SIGSTOP takeover needs the pg_read_all_stats
// setup grants (a standby sees the active's replies). The role goes with
// the test's cluster.
func (w *world) asSetupRole(ctx context.Context, role string) {
	w.t.Helper()
	out, err := exec.CommandContext(ctx, w.bin, "setup", "--postgres", w.dsn, "--no-slot", "--role", role).CombinedOutput()
	if err != nil {
		w.t.Fatalf("outboxd setup --role: %v\n%s", err, out)
	}
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var stats bool
	if err := conn.QueryRow(ctx, `SELECT pg_has_role($1, 'pg_read_all_stats', 'USAGE')`, role).Scan(&stats); err != nil || !stats {
		w.t.Fatalf("role %s: pg_read_all_stats %v (err %v) after outboxd setup --role; the SIGSTOP takeover needs it", role, stats, err)
	}
	dsn := strings.Replace(w.relayDSN, "postgres://postgres@", "postgres://"+role+"@", 1)
	if dsn == w.relayDSN {
		w.t.Fatalf("could not rewrite the user of %q", w.relayDSN)
	}
	w.relayDSN = dsn
}
