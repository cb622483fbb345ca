package query

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
)

// MaxReadRequestBytes bounds a remote-read request's (snappy-compressed)
// body. A request lists selectors, not data: Prometheus' own client sends a
// few hundred bytes per query. Prometheus accepts up to 32 MiB, but here the
// body is held in memory while the request waits for a slot
// (ReadWholeBody), so it must be small.
const MaxReadRequestBytes = 1 << 20

// ReadWholeBody reads a request's body into memory (at most max bytes; 413
// past it) before next runs.
//
// Go's HTTP/1 server notices that a client hung up only once the handler
// has read the request body to its end: until then it does not read the
// connection, and the request's context is never cancelled. Prometheus'
// remote-read handler waits for its concurrency slot before it reads the
// body, so a request whose client had gone waited (and, with a limit of 0,
// waited forever), holding a goroutine and a file descriptor each
// (TestAbandonedRemoteReadsLeaveNothing). Read first, the body's end starts
// the server's watch on the connection: a waiting request whose client
// leaves is cancelled at once, and a running one stops at its next select.
func ReadWholeBody(max int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
		if err != nil {
			http.Error(w, fmt.Sprintf("read request body: %v", err), http.StatusBadRequest)
			return
		}
		if int64(len(body)) > max {
			http.Error(w, fmt.Sprintf("request body larger than %d bytes", max), http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// remoteReadGateSize is the size of the remote-read handler's concurrency
// gate for a configured limit: Prometheus documents 0 as no limit, but its
// gate of size 0 never lets a request through; a gate of MaxInt32 slots of
// empty structs costs nothing.
func remoteReadGateSize(limit int) int {
	if limit <= 0 {
		return math.MaxInt32
	}
	return limit
}
