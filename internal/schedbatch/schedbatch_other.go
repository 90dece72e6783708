//go:build !linux

package schedbatch

import "errors"

// Set is Linux's: elsewhere it changes nothing.
func Set() (Result, error) { return Result{}, errors.ErrUnsupported }
