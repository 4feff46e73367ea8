package xdp

// Latency tracing: a build of the project with the tag xmxtrace records a
// timestamp at a few points of the path from a send to the answer's
// arrival, so that a ping-pong benchmark can say where a round trip's time
// goes (msglayer's BenchmarkTraceAFXDP prints the breakdown). Without the
// tag, Trace is an empty function the compiler removes: the points cost
// nothing.
//
// Each side of a benchmark (a link and the goroutine driving it) writes
// its own log, so that tracing adds no cache line shared between the two
// CPUs: a shared index or log would cost a cache miss per point and
// distort exactly what it measures.

// TracePoint names a point of the traced path.
type TracePoint int32

// The traced points, in the order one message passes them.
const (
	TraceStart      TracePoint = iota // benchmark: a round trip begins (side 0)
	TraceSendCall                     // msglayer: Isend entered
	TraceFramed                       // msglayer: Isend's frames are queued, the flush begins
	TraceLinkSend                     // link: SendBuilt entered
	TraceKick                         // link: sendto about to be called
	TraceKicked                       // link: sendto returned
	TraceSleep                        // link: a receive goes to sleep in poll
	TraceWoke                         // link: a receive's poll returned
	TraceRxSeen                       // link: a receive found frames on the RX ring
	TraceDispatched                   // msglayer: a received frame was handled
	TraceReturned                     // benchmark: the receiver's Wait (or Recv) returned
	TraceAnswer                       // benchmark: the receiver starts its answer (side 1)
	numTracePoints
)

var tracePointNames = [numTracePoints]string{"start", "send-call", "framed", "link-send", "kick", "kicked", "sleep", "woke", "rx-seen", "dispatched", "returned", "answer"}

func (p TracePoint) String() string {
	if p >= 0 && p < numTracePoints {
		return tracePointNames[p]
	}
	return "point?"
}

// TraceEvent is one recorded point.
type TraceEvent struct {
	Point TracePoint
	Side  int32
	TSC   int64 // ticks of the time-stamp counter (nanoseconds without one)
	CPU   int32 // the CPU it was recorded on (-1: unknown)
}
