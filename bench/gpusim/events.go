package gpusim

// eventProc is a deterministic Poisson process of rare events (ECC single-bit
// errors, PCIe replays, NVLink CRC errors, background Xids, NIC drops). Event
// i happens at the sum of the first i exponential gaps drawn from
// hash(seed, identity, i), starting at the epoch, so its count at any instant
// is a pure function of time. The cached position makes forward queries O(1)
// amortised; a query before the cached position replays from the epoch,
// adding the same numbers in the same order (bit-identical sums).
type eventProc struct {
	base   uint64  // hash identity
	mean   float64 // mean gap in seconds; 0: never
	maxSz  uint64  // event sizes are 1..maxSz
	codes  []int   // when set, each event carries a code drawn from it
	n      uint64  // events consumed
	last   float64 // time of the last consumed event
	next   float64 // time of the next event
	cum    float64 // summed sizes of consumed events
	code   int     // code of the last consumed event
	primed bool
}

func newEventProc(base uint64, mean float64, maxSz uint64, codes []int) eventProc {
	return eventProc{base: base, mean: mean, maxSz: max(maxSz, 1), codes: codes}
}

func (p *eventProc) reset() {
	p.n, p.last, p.cum, p.code = 0, 0, 0, 0
	p.next = expo(h2(p.base, 0), p.mean)
	p.primed = true
}

// at advances to time s (seconds since epoch) and returns (total size, last code).
func (p *eventProc) at(s float64) (float64, int) {
	if p.mean <= 0 || s < 0 {
		return 0, 0
	}
	if !p.primed || (p.n > 0 && s < p.last) {
		p.reset()
	}
	for p.next <= s {
		h := h2(p.base, p.n+1)
		p.cum += float64(1 + h%p.maxSz)
		if p.codes != nil {
			p.code = p.codes[(h>>20)%uint64(len(p.codes))]
		}
		p.n++
		p.last = p.next
		p.next += expo(h2(p.base, ^p.n), p.mean)
	}
	return p.cum, p.code
}

// lastTime reports the time of the last event consumed by at, if any.
func (p *eventProc) lastTime() (float64, bool) { return p.last, p.n > 0 }

// backgroundXids are Xids a busy fleet sees now and then without hardware
// faults: mostly application-side (13 graphics engine exception, 31 MMU
// fault, 43 GPU stopped processing, 45 preemptive cleanup after a killed
// job), rarely hardware (63/94 ECC row-remap/contained, 74 NVLink).
var backgroundXids = []int{13, 13, 31, 31, 43, 43, 45, 45, 45, 63, 74, 94}
