package regcache

import (
	"errors"
	"fmt"
	"strings"
)

// Errors of a remote access check (Lookup, Hold). They are returned as is,
// without wrapping, so that the check does not allocate.
var (
	// ErrNoRegion: the id is unknown, stale (deregistered, evicted,
	// invalidated, unmapped) or 0.
	ErrNoRegion = errors.New("regcache: no such region")
	// ErrBadKey: the region exists but the key does not match.
	ErrBadKey = errors.New("regcache: bad region key")
	// ErrOutOfBounds: off+length lies outside the region (or wraps around).
	ErrOutOfBounds = errors.New("regcache: access out of region bounds")
)

// Errors of the local API, wrapped in an error naming the operation.
var (
	// ErrLimit: a cache registration would exceed MaxRegions or
	// MaxLockedBytes and not enough unused regions can be evicted, or a
	// Registry ran out of region slots.
	ErrLimit = errors.New("regcache: registration limit reached")
	// ErrClosed: the Registry or Cache is closed.
	ErrClosed = errors.New("regcache: closed")
	// ErrUnmapped: the memory is being unmapped by Unmap.
	ErrUnmapped = errors.New("regcache: memory is being unmapped")
	// ErrNotMapped: Unmap of memory that Map did not return.
	ErrNotMapped = errors.New("regcache: not a mapping made by Map")
)

// opError names the operation that failed ("register 4096 bytes at
// 0x7f...") and wraps the cause.
type opError struct {
	op   string
	err  error
	hint string // appended in parentheses
}

func (e *opError) Error() string {
	s := "regcache: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "regcache: ")
	if e.hint != "" {
		s += " (" + e.hint + ")"
	}
	return s
}

func (e *opError) Unwrap() error { return e.err }

func opErr(err error, format string, args ...any) error {
	return &opError{op: fmt.Sprintf(format, args...), err: err}
}
