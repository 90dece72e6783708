package main

import (
	"context"
	"errors"
)

func setupCommand(ctx context.Context, e env, args []string) error  { return errors.New("not yet") }
func statusCommand(ctx context.Context, e env, args []string) error { return errors.New("not yet") }
func slotCommand(ctx context.Context, e env, args []string) error   { return errors.New("not yet") }
