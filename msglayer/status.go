package msglayer

import (
	"errors"
	"fmt"
	"net"
)

// Code is the outcome of a request, as MX's mx_status_code_t.
type Code uint8

const (
	Success     Code = iota // the request completed fully
	Truncated               // the receive buffer was shorter than the message: XferLen < MsgLen
	Cancelled               // Cancel took the request back before it matched
	Timeout                 // a connect or a resolve found nobody in time
	Unreachable             // the peer stopped answering: retransmissions gave up
	Closed                  // the endpoint was closed while the request was pending
	BadSession              // the peer restarted (its session changed) or forgot us: reconnect
	BadKey                  // the peer refused the connect: wrong key
	BadEndpoint             // no endpoint with that id at the peer
	Aborted                 // the peer refused the operation
	BadRegion               // a registered-region access was refused: unknown id, wrong key or out of bounds
)

var codeNames = [...]string{"success", "truncated", "cancelled", "timeout", "endpoint unreachable",
	"endpoint closed", "bad session", "bad key", "bad endpoint", "aborted", "bad region"}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// Errors matching the status codes, for errors.Is. ErrClosed is
// net.ErrClosed, as for every closed thing in Go.
var (
	ErrTruncated   = errors.New("msglayer: message truncated")
	ErrCancelled   = errors.New("msglayer: request cancelled")
	ErrTimeout     = errors.New("msglayer: timed out")
	ErrUnreachable = errors.New("msglayer: peer unreachable")
	ErrClosed      = net.ErrClosed
	ErrBadSession  = errors.New("msglayer: bad session (peer restarted or forgot us)")
	ErrBadKey      = errors.New("msglayer: connect refused: bad key")
	ErrBadEndpoint = errors.New("msglayer: no such endpoint at the peer")
	ErrAborted     = errors.New("msglayer: aborted by the peer")
	ErrBadRegion   = errors.New("msglayer: remote region access refused (id, key or bounds)")
)

// Err returns the error matching c, nil for Success.
func (c Code) Err() error {
	switch c {
	case Success:
		return nil
	case Truncated:
		return ErrTruncated
	case Cancelled:
		return ErrCancelled
	case Timeout:
		return ErrTimeout
	case Unreachable:
		return ErrUnreachable
	case Closed:
		return ErrClosed
	case BadSession:
		return ErrBadSession
	case BadKey:
		return ErrBadKey
	case BadEndpoint:
		return ErrBadEndpoint
	case BadRegion:
		return ErrBadRegion
	}
	return ErrAborted
}

// API errors: invalid arguments name themselves.
var (
	ErrBadMatchMask = errors.New("msglayer: match info has bits outside the mask")
	ErrTooManySegs  = errors.New("msglayer: more than 256 segments")
	ErrTooLong      = errors.New("msglayer: message longer than 4 GiB - 1")
	ErrNotConnected = errors.New("msglayer: peer not connected")
	ErrStaleRequest = errors.New("msglayer: request already completed and released")
	// ErrForeignRequest: a live request handed to another endpoint's
	// Test, Wait, Cancel or similar call.
	ErrForeignRequest = errors.New("msglayer: request belongs to another endpoint")
	ErrNotCancelled   = errors.New("msglayer: only unmatched receives and pending connects can be cancelled")
	ErrOtherLink      = errors.New("msglayer: endpoint not on the group's link") // Group.On
)

// Status describes a completed request (MX's mx_status_t).
type Status struct {
	Code   Code
	Source Addr   // the peer: sender of a receive, destination of a send
	Match  uint64 // match info of the message (of a receive that got none: the info it was posted with)
	MsgLen int    // length the sender sent
	// XferLen is the length delivered. A send learns it when it completes
	// after its receive matched (a rendezvous message, Issend, a
	// same-process send that found its receive posted); one that completes
	// before (an eager message, acknowledged or buffered by the receiver,
	// or taken by its unexpected-message handler) reports its whole length.
	// A rendezvous message the receiver's handler took had 0 delivered.
	// A receive that failed (its peer unreachable, say) reports the
	// prefix of the data that had arrived: its buffer holds those bytes.
	XferLen int
	Context any // the context given when the request was posted
}

// Err returns nil for Success and an error matching the code otherwise,
// carrying the peer and the lengths.
func (s Status) Err() error {
	if s.Code == Success {
		return nil
	}
	return &StatusError{Status: s}
}

// StatusError is a non-success status as an error; errors.Is matches it
// against the Err* sentinel of its code.
type StatusError struct{ Status Status }

func (e *StatusError) Error() string {
	s := e.Status
	if s.Code == Truncated {
		return fmt.Sprintf("msglayer: message of %d bytes from %v truncated to %d", s.MsgLen, s.Source, s.XferLen)
	}
	return fmt.Sprintf("msglayer: %v (peer %v, match %#x)", s.Code, s.Source, s.Match)
}

func (e *StatusError) Unwrap() error { return e.Status.Code.Err() }

// ArgError names an invalid argument.
type ArgError struct {
	Arg string
	Err error
}

func (e *ArgError) Error() string { return "msglayer: argument " + e.Arg + ": " + e.Err.Error() }
func (e *ArgError) Unwrap() error { return e.Err }
