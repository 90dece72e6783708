//go:build !linux

package main

// dieWithParent: only Linux has PR_SET_PDEATHSIG; elsewhere Ctrl-C cleans up.
func dieWithParent() {}
