package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/outboxd/outboxd/internal/humanize"
	"github.com/outboxd/outboxd/internal/pgsql"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/pgquote"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

const statusSummary = `Shows every replication slot of the database (holder, confirmed flush LSN, lag,
retained WAL, wal_status) and the publication's tables, from PostgreSQL alone:
it needs no running outboxd, and an ordinary connection suffices.`

type statusOptions struct {
	Postgres    string
	Slot        string
	Publication string
	JSON        bool
}

func (o *statusOptions) register(s *optionSet) {
	fs := s.fs
	fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL connection string (any role that may log in)")
	registerPostgresFile(s, &o.Postgres)
	fs.StringVar(&o.Slot, "slot", "outboxd", "outboxd's slot, marked * in the table")
	fs.StringVar(&o.Publication, "publication", "outboxd", "publication whose tables to list")
	fs.BoolVar(&o.JSON, "json", false, "print one JSON object instead of tables")
}

func statusCommand(ctx context.Context, e env, args []string) (err error) {
	var o statusOptions
	defer func() { err = redact.Err(err, o.Postgres) }()
	set := newOptionSet("status")
	o.register(set)
	if err := set.parseOrHelp(args, e.getenv, e.stdout, statusSummary); err != nil {
		return err
	}
	o.Postgres = orLibpq(o.Postgres, e.getenv)
	if o.Postgres == "" {
		return errors.New("--postgres (OUTBOXD_POSTGRES) is required, or libpq's PGHOST/PGDATABASE/PGUSER/PGSERVICE variables")
	}
	conn, err := pgsql.Connect(ctx, o.Postgres, "outboxd status")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	r, err := slot.ReadStatus(ctx, conn, o.Slot, o.Publication)
	if err != nil {
		return err
	}
	if o.JSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	writeStatus(e.stdout, r)
	return nil
}

// writeStatus prints outboxd status's report: the server, the database's
// slots (and what to do about idle or lost ones), then the publication.
func writeStatus(w io.Writer, r *slot.Status) {
	where := "current WAL"
	if r.InRecovery {
		where = "standby, replayed WAL"
	}
	version, _, _ := strings.Cut(r.ServerVersion, " ") // "15.4 (Debian 15.4-1)"
	fmt.Fprintf(w, "database %s on PostgreSQL %s, %s %s\n\n", r.Database, version, where, r.CurrentWALLSN)
	writeSlots(w, r)
	writeSelectedSlot(w, r)
	writeOtherSlots(w, r.OtherSlots)
	writeSlotAdvice(w, r.Slots)
	fmt.Fprintln(w)
	writePublication(w, r.Publication, r.Database)
}

// writeSlots is the table of the database's slots, * marking --slot.
func writeSlots(w io.Writer, r *slot.Status) {
	if len(r.Slots) == 0 {
		fmt.Fprintf(w, "no replication slots in database %s\n", r.Database)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// FAILOVER always (no on PostgreSQL ≤ 16), SYNCED where it matters: on a standby.
	head := "  SLOT\tPLUGIN\tACTIVE\tHOLDER\tCONFIRMED FLUSH\tLAG\tRETAINED WAL\tWAL STATUS\tSAFE WAL SIZE\tFAILOVER"
	if r.InRecovery {
		head += "\tSYNCED"
	}
	fmt.Fprintln(tw, head)
	for _, s := range r.Slots {
		mark := " "
		if s.Selected {
			mark = "*"
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", mark, s.Name, orDash(s.Plugin), yesNo(s.Active), holder(s),
			lsnOrDash(s.ConfirmedFlush), bytesOrDash(s.LagBytes), bytesOrDash(s.RetainedBytes), orDash(s.WALStatus), safeWALSize(s), yesNo(s.Failover))
		if r.InRecovery {
			fmt.Fprintf(tw, "\t%s", yesNo(s.Synced))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// writeSelectedSlot says where --slot is: marked in the table, in another
// database, or nowhere.
func writeSelectedSlot(w io.Writer, r *slot.Status) {
	switch {
	case r.SlotFound && slotIn(r.Slots, r.Slot):
		fmt.Fprintf(w, "(* is --slot %s)\n", r.Slot)
	case r.SlotFound:
		for _, s := range r.OtherSlots {
			if s.Selected {
				fmt.Fprintf(w, "slot %s belongs to database %q, not %s: point --postgres at that database\n", r.Slot, s.Database, r.Database)
			}
		}
	default:
		fmt.Fprintf(w, "slot %s does not exist (outboxd setup or outboxd run creates it)\n", r.Slot)
	}
}

// writeOtherSlots counts the slots of other databases and of physical
// replication by database, with the most WAL one of them retains.
func writeOtherSlots(w io.Writer, others []slot.Listed) {
	if len(others) == 0 {
		return
	}
	byDB := map[string]int{}
	var retained int64
	for _, s := range others {
		db := s.Database
		if db == "" {
			db = "physical"
		}
		byDB[db]++
		if s.RetainedBytes != nil {
			retained = max(retained, *s.RetainedBytes)
		}
	}
	dbs := make([]string, 0, len(byDB))
	for db, c := range byDB {
		dbs = append(dbs, db+": "+strconv.Itoa(c))
	}
	sort.Strings(dbs)
	if len(dbs) > 6 {
		dbs = append(dbs[:6], "…")
	}
	fmt.Fprintf(w, "note: %d more slot(s) of other databases or physical replication not shown (%s), retaining up to %s of WAL\n",
		len(others), strings.Join(dbs, ", "), humanize.Bytes(retained))
}

// writeSlotAdvice warns about lost slots and notes the inactive ones, which
// keep their WAL.
func writeSlotAdvice(w io.Writer, slots []slot.Listed) {
	var idle []string
	for _, s := range slots {
		if !s.Active && s.WALStatus != "lost" {
			idle = append(idle, s.Name)
		}
		if s.WALStatus == "lost" {
			fmt.Fprintf(w, "warning: slot %s was invalidated (wal_status lost): WAL it needed is gone and events were lost; drop it (outboxd slot drop --slot %s) and re-publish from the outbox table\n", s.Name, s.Name)
		}
	}
	if len(idle) > 0 {
		fmt.Fprintf(w, "note: inactive slots keep their WAL until a consumer confirms it or they are dropped (outboxd slot drop --slot NAME): %s\n", strings.Join(idle, ", "))
	}
}

// writePublication is the publication, what it publishes and its tables.
func writePublication(w io.Writer, p slot.PublicationStatus, database string) {
	if !p.Exists {
		fmt.Fprintf(w, "publication %s does not exist in database %s (outboxd setup creates it)\n", p.Name, database)
		return
	}
	scope := ""
	if p.AllTables {
		scope = ", FOR ALL TABLES"
	}
	fmt.Fprintf(w, "publication %s (publish %s%s)\n", p.Name, orDash(migrations.PublishedOps(p.Insert, p.Update, p.Delete, p.Truncate)), scope)
	if len(p.Tables) == 0 {
		fmt.Fprintln(w, "  no tables: ALTER PUBLICATION … ADD TABLE public.outbox; (or outboxd setup)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TABLE\tINSERT\tUPDATE\tDELETE\tTRUNCATE")
	for _, t := range p.Tables {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", t, yesNo(p.Insert), yesNo(p.Update), yesNo(p.Delete), yesNo(p.Truncate))
	}
	tw.Flush()
	if !p.Insert {
		fmt.Fprintf(w, "warning: the publication does not publish INSERTs, so no outbox event arrives; fix: ALTER PUBLICATION %s SET (publish = 'insert');\n", pgquote.Ident(p.Name))
	}
}

func slotIn(slots []slot.Listed, name string) bool {
	for _, s := range slots {
		if s.Name == name {
			return true
		}
	}
	return false
}

// holder says who streams from a slot: PID, application_name, client address.
func holder(s slot.Listed) string {
	if !s.Active || s.ActivePID == 0 {
		return "-"
	}
	h := "PID " + strconv.Itoa(s.ActivePID)
	var who []string
	if s.Holder.Application != "" {
		who = append(who, s.Holder.Application)
	}
	if s.Holder.Client != "" {
		who = append(who, s.Holder.Client)
	}
	if len(who) > 0 {
		h += " (" + strings.Join(who, ", ") + ")"
	}
	return h
}

func safeWALSize(s slot.Listed) string {
	switch {
	case s.SafeWALSize != nil:
		return humanize.Bytes(*s.SafeWALSize)
	case s.WALStatus == "lost" || s.WALStatus == "":
		return "-"
	default:
		return "unlimited" // max_slot_wal_keep_size = -1
	}
}

func bytesOrDash(n *int64) string {
	if n == nil {
		return "-"
	}
	return humanize.Bytes(*n)
}

func lsnOrDash(l wal.LSN) string {
	if l == 0 {
		return "-"
	}
	return l.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
