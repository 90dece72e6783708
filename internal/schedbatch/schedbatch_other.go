//go:build !linux

package schedbatch

import "errors"

// Set is Linux's: elsewhere it changes nothing.
func Set() (Result, error) { return Result{}, errors.ErrUnsupported }

// Reset is Linux's: elsewhere it changes nothing.
func Reset() (Result, error) { return Result{}, errors.ErrUnsupported }

// Default is Linux's: elsewhere it reports ErrUnsupported.
func Default() (bool, error) { return false, errors.ErrUnsupported }
