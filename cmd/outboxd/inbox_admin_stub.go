package main

import "fmt"

// inboxAdmin is a placeholder until the broker-neutral inbox brings
// cmd/outboxd/inbox_admin.go (outboxd inbox list|release); the lead deletes
// this file at the merge.
func inboxAdmin(verb string, _ []string) error {
	return fmt.Errorf("outboxd inbox %s is not in this build yet", verb)
}
