package limits

import "sync/atomic"

// InflightBytes bounds the bytes that the requests in progress hold, for the
// whole process (as Mimir's -distributor.max-inflight-push-requests-bytes
// does): each request reserves what it takes as it takes it, and releases
// it all when it is done. Per-tenant bounds alone do not bound the process:
// every tenant may have its requests in progress at once.
type InflightBytes struct {
	max int64 // 0: no bound
	cur atomic.Int64
}

// NewInflightBytes returns a bound of max bytes; 0 counts without bounding.
func NewInflightBytes(max int64) *InflightBytes { return &InflightBytes{max: max} }

// Reserve takes n more bytes, unless that passes the bound: then it takes
// nothing and returns false.
func (b *InflightBytes) Reserve(n int64) bool {
	for {
		c := b.cur.Load()
		if b.max > 0 && c+n > b.max {
			return false
		}
		if b.cur.CompareAndSwap(c, c+n) {
			return true
		}
	}
}

// Release gives back n reserved bytes.
func (b *InflightBytes) Release(n int64) { b.cur.Add(-n) }

// Bytes is what is reserved now.
func (b *InflightBytes) Bytes() int64 { return b.cur.Load() }

// Max is the bound; 0: none.
func (b *InflightBytes) Max() int64 { return b.max }
