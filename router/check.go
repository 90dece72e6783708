package router

import "github.com/outboxd/outboxd/wal"

// Unroutable says why no row of rel could become a record ("" if rows can):
// the startup check of the publication's tables (slot.Config.Unroutable),
// so that a table outboxd cannot route (a business table of a FOR ALL
// TABLES publication) is refused before streaming, not at its first row.
func (r *Router) Unroutable(rel *wal.Relation) string { return r.buildPlan(rel).err }
