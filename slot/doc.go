// Package slot owns the replication slot: it checks and prepares the server
// (wal_level, publication, slot plugin and holder) before streaming, and it
// keeps the ack watermark that decides which LSN may be confirmed.
//
// The watermark is the safety core of outboxd: the LSN it reports is the end
// of the newest transaction such that it and every earlier transaction have
// been acknowledged by the sink. Nothing past it is ever confirmed.
package slot
