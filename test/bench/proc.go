package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of utime/stime in /proc/<pid>/stat. It is
// 100 on every Linux architecture Go supports in practice.
const clockTick = 10 * time.Millisecond

// procStat is what the bench reads of /proc/<pid>/stat.
type procStat struct {
	state byte
	ppid  int
	cpu   time.Duration // utime + stime, all threads
}

// readStat parses /proc/<pid>/stat. The command name may hold spaces and
// parentheses, so fields are counted from the last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ppid, _ := strconv.Atoi(f[1])
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return procStat{state: f[0][0], ppid: ppid, cpu: time.Duration(ut+st) * clockTick}, nil
}

// cpuOf is the CPU time a process has used so far (0 if it is gone).
func cpuOf(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	s, err := readStat(pid)
	if err != nil {
		return 0
	}
	return s.cpu
}

// statusKB reads a "Key:   123 kB" line of /proc/<pid>/status, in bytes.
func statusKB(pid int, key string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				n, _ := strconv.ParseInt(fs[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}

// peakRSS is VmHWM, the process's peak resident set size, in bytes.
func peakRSS(pid int) int64 { return statusKB(pid, "VmHWM") }

// children lists the CPU time of every live child of parent.
func children(parent int) map[int]time.Duration {
	out := map[int]time.Duration{}
	if parent <= 0 {
		return out
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readStat(pid); err == nil && s.ppid == parent {
			out[pid] = s.cpu
		}
	}
	return out
}

// findProc returns the pid of the first process whose command line
// contains substr (0 if none).
func findProc(substr string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), substr) {
			return pid
		}
	}
	return 0
}

// postmasterPID reads the first line of <datadir>/postmaster.pid.
func postmasterPID(dataDir string) int {
	if dataDir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// cpuSnapshot is the CPU time of the processes a measurement splits the
// machine's time between.
type cpuSnapshot struct {
	at       time.Time
	busy     time.Duration // the whole machine's non-idle time (/proc/stat)
	self     time.Duration
	broker   map[int]time.Duration // the broker's processes (kfaked or the Kafka JVMs)
	postgres map[int]time.Duration // children of the postmaster
	hogs     map[int]time.Duration // -hogs: stress-ng and its workers (nil without)
}

// CPUSplit is CPU time by process over one measurement window.
type CPUSplit struct {
	Wall      time.Duration
	Outboxd   time.Duration // the relay process (0 when it did not run)
	Walsender time.Duration // the walsender(s) serving the measured slot
	Postgres  time.Duration // every other PostgreSQL process (backends, checkpointer, autovacuum …)
	Broker    time.Duration // kfaked, or every Kafka JVM of the cluster together
	BrokerIs  string        // what Broker counts: "kfaked", "kafka JVM", "3 kafka JVMs"
	Bench     time.Duration // this process: the ceiling reader, the polling publisher, writers, monitors
	Known     bool          // false when the servers are external (no pids)
	Label     string        // what the Walsender column holds when it is not a walsender
	Hogs      time.Duration // -hogs: the CPU hogs' (stress-ng) time, not counted in Others
	HogsN     int           // how many CPU hogs ran beside the window (0: none)
	Busy      time.Duration // the whole machine's non-idle CPU time over the window
}

// Others is the machine's busy time not accounted to the processes above:
// kernel threads, interrupts and anything else running on the machine (the
// -hogs are accounted: a load the run chose).
func (c CPUSplit) Others() time.Duration {
	return max(0, c.Busy-(c.Outboxd+c.Walsender+c.Postgres+c.Broker+c.Bench+c.Hogs))
}

func (e *Env) snapshot() cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), busy: machineBusy(), self: cpuOf(os.Getpid()), broker: map[int]time.Duration{}, postgres: children(e.postmasterPID), hogs: e.hogs.pids()}
	for _, pid := range e.brokerProcs() {
		s.broker[pid] = cpuOf(pid)
	}
	return s
}

// machineBusy is the non-idle CPU time of all cores since boot: user, nice,
// system, irq, softirq and steal from the first line of /proc/stat.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * clockTick
}

// split computes the CPU used since s. walsenders are postmaster children
// reported separately; processes that started during the window count in
// full, processes that ended during it are lost (short-lived backends only).
func (e *Env) split(s cpuSnapshot, walsenders ...int) CPUSplit {
	now := e.snapshot()
	c := CPUSplit{Wall: now.at.Sub(s.at), Busy: now.busy - s.busy, Bench: now.self - s.self, Known: e.postmasterPID > 0 && len(e.brokerProcs()) > 0}
	for pid, cpu := range now.broker {
		if before, ok := s.broker[pid]; ok && cpu >= before {
			c.Broker += cpu - before
		}
	}
	if e.hogs != nil {
		c.HogsN = e.hogs.n
		for pid, cpu := range now.hogs {
			if before, ok := s.hogs[pid]; ok && cpu >= before {
				c.Hogs += cpu - before
			}
		}
	}
	switch n := len(s.broker); {
	case e.mq != nil:
		c.BrokerIs = e.mq.brokerIs()
	case e.Kafka != nil && e.Kafka.Apache() == nil:
		c.BrokerIs = "kfaked"
	case n == 1:
		c.BrokerIs = "kafka JVM"
	default:
		c.BrokerIs = fmt.Sprintf("%d kafka JVMs", n)
	}
	isWS := map[int]bool{}
	for _, p := range walsenders {
		isWS[p] = true
	}
	for pid, cpu := range now.postgres {
		d := cpu - s.postgres[pid]
		if isWS[pid] {
			c.Walsender += d
		} else {
			c.Postgres += d
		}
	}
	return c
}

// pct formats d as a percentage of one core over wall.
func pct(d, wall time.Duration) string {
	if wall <= 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f%%", 100*d.Seconds()/wall.Seconds())
}

// String renders the split as "% of one core" figures.
func (c CPUSplit) String() string {
	if !c.Known {
		return "n/a (external servers)"
	}
	var parts []string
	if c.Outboxd > 0 {
		parts = append(parts, "outboxd "+pct(c.Outboxd, c.Wall))
	}
	label := c.Label
	if label == "" {
		label = "walsender"
	}
	parts = append(parts, label+" "+pct(c.Walsender, c.Wall), "pg-other "+pct(c.Postgres, c.Wall),
		c.BrokerIs+" "+pct(c.Broker, c.Wall), "bench "+pct(c.Bench, c.Wall))
	if c.HogsN > 0 {
		parts = append(parts, fmt.Sprintf("%d hogs %s", c.HogsN, pct(c.Hogs, c.Wall)))
	}
	parts = append(parts, "others "+pct(c.Others(), c.Wall))
	return strings.Join(parts, " ") + fmt.Sprintf(" = %s/%d00%%", pct(c.Busy, c.Wall), runtime.NumCPU())
}

// Machine describes the host the numbers were measured on.
type Machine struct {
	NProc    int
	CPUModel string
	MemTotal string
	Kernel   string
	Go       string
	Postgres string
	LoadAvg  string
}

func describeMachine() Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version(), LoadAvg: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if kb := statusLine("/proc/meminfo", "MemTotal"); kb > 0 {
		m.MemTotal = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

func statusLine(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			if fs := strings.Fields(rest); len(fs) > 0 {
				n, _ := strconv.ParseInt(fs[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// procLife is how long pid has been running (0 if it is gone): its start
// time (field 22 of /proc/<pid>/stat, in ticks since boot) against
// /proc/uptime, both to 10 ms.
func procLife(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(up))
	if len(f) == 0 {
		return 0
	}
	uptime, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	sf := strings.Fields(string(b[i+1:]))
	if len(sf) < 20 {
		return 0
	}
	start, err := strconv.ParseInt(sf[19], 10, 64)
	if err != nil {
		return 0
	}
	return max(0, time.Duration(uptime*float64(time.Second))-time.Duration(start)*clockTick)
}

// ctxSwitches is the voluntary and involuntary context switches of every
// live thread of pid, summed over /proc/<pid>/task/*/status (the process's
// own status counts its main thread only). A thread that already exited is
// not counted: Go's threads live as long as the process.
func ctxSwitches(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var n int64
	for _, t := range tasks {
		p := fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name())
		n += statusLine(p, "voluntary_ctxt_switches") + statusLine(p, "nonvoluntary_ctxt_switches")
	}
	return n
}

// contendedShare is the share of one core that others (CPUSplit.Others)
// may take before a measurement is marked busy: beyond it the figures
// measure the neighbours as much as the processes.
const contendedShare = 0.25

// Contended reports whether others took more than contendedShare of a core
// over the window.
func (c CPUSplit) Contended() bool {
	return c.Known && c.Wall > 0 && c.Others().Seconds() > contendedShare*c.Wall.Seconds()
}
