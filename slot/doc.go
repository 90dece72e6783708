// Package slot is outboxd's replication slot: what the server says about
// it (one Slot type read by one query, List and Get, on replication and
// ordinary connections alike), making it fit to stream from (Prepare:
// wal_level, publication, plugin, holder, gaps), dropping it (Drop), and the
// ack watermark that decides which LSN may be confirmed to it.
//
// The watermark is the safety core of outboxd: the LSN it reports is the end
// of the newest transaction such that it and every earlier transaction have
// been acknowledged by the sink. Nothing past it is ever confirmed.
package slot
