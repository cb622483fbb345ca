package block

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// xorWriter writes the bytes of the TSDB's XOR chunk (Prometheus'
// docs/format/chunks.md: a big-endian sample count, the first timestamp as
// a varint and value as 64 bits, the second timestamp's delta as a uvarint,
// then delta-of-deltas in 1, 16, 20, 24 or 68 bits, each value XOR the
// previous one with leading and trailing zeros left out), sample by sample
// as the column form holds them: timestamps as delta-of-deltas, values as
// their float bits XOR the previous value's.
//
// It writes what chunkenc's xorAppender writes, but through a 64-bit
// accumulator instead of a bit at a time, and a sample's codes and bits in
// one write where they fit: decoding a frame of the column form writes
// every chunk of the frame again, so this is most of a cold read's cost
// (chunkenc's appender took 47 ns a sample, a writer of separate bit
// fields 18 with the columns' reading). Encoding keeps a chunk in column
// form only when this gives back its bytes, so a sample this would write
// otherwise leaves the chunk verbatim, never wrong.
type xorWriter struct {
	out               []byte
	acc               uint64 // pending bits: the low n bits of acc (up to 64)
	n                 uint
	leading, trailing uint8 // the previous stored value's zeros (leading 0xff: none yet)
}

// maxXORSampleBytes bounds what one sample adds to an XOR chunk: a 68-bit
// timestamp code and a 77-bit value code.
const maxXORSampleBytes = 19

// startXOR starts a chunk of samples samples appended to dst, its first
// sample at t0 with value bits x0.
func startXOR(dst []byte, samples int, t0 int64, x0 uint64) xorWriter {
	dst = binary.BigEndian.AppendUint16(dst, uint16(samples))
	dst = binary.AppendVarint(dst, t0)
	return xorWriter{out: binary.BigEndian.AppendUint64(dst, x0), leading: 0xff}
}

// second writes the second sample: its timestamp's delta, its value bits
// XOR the first's. The uvarint is whole bytes, but the bits before it are
// too (the first sample's), so it goes straight to out.
func (w *xorWriter) second(delta int64, x uint64) {
	w.out = binary.AppendUvarint(w.out, uint64(delta))
	w.value(x)
}

// next writes a sample after the second: its timestamp's delta-of-delta,
// its value bits XOR the previous value's. The common sample of GPU data (a
// regular scrape: delta-of-delta 0) writes both in one accumulator step.
func (w *xorWriter) next(dod int64, x uint64) {
	if dod == 0 && x == 0 {
		w.put(0, 2)
		return
	}
	switch {
	case dod == 0:
		w.put(0, 1)
	case fitsBits(dod, 14):
		w.put(0b10<<14|uint64(dod)&(1<<14-1), 16)
	case fitsBits(dod, 17):
		w.put(0b110<<17|uint64(dod)&(1<<17-1), 20)
	case fitsBits(dod, 20):
		w.put(0b1110<<20|uint64(dod)&(1<<20-1), 24)
	default:
		w.put(0b1111, 4)
		w.put(uint64(dod), 64)
	}
	w.value(x)
}

func fitsBits(x int64, k uint) bool { return -(1<<(k-1)-1) <= x && x <= 1<<(k-1) }

// value writes a value XOR the previous one: 0 when equal, else 1, then 0
// and the bits between the previous leading and trailing zeros when the
// XOR fits in them, or 1, the leading zeros (at most 31) in 5 bits, the
// significant bits' count in 6 (64 as 0) and those bits.
func (w *xorWriter) value(x uint64) {
	if x == 0 {
		w.put(0, 1)
		return
	}
	l, t := uint8(min(bits.LeadingZeros64(x), 31)), uint8(bits.TrailingZeros64(x))
	if w.leading != 0xff && l >= w.leading && t >= w.trailing {
		sig := uint(64 - w.leading - w.trailing)
		if sig <= 62 {
			w.put(0b10<<sig|x>>w.trailing, 2+sig)
			return
		}
		w.put(0b10, 2)
		w.put(x>>w.trailing, sig)
		return
	}
	w.leading, w.trailing = l, t
	sig := uint(64 - l - t)
	code := 0b11<<11 | uint64(l)<<6 | uint64(sig&63)
	if sig <= 51 {
		w.put(code<<sig|x>>t, 13+sig)
		return
	}
	w.put(code, 13)
	w.put(x>>t, sig)
}

// put writes the low nb ≤ 64 bits of u.
func (w *xorWriter) put(u uint64, nb uint) {
	if w.n+nb <= 64 {
		w.acc = w.acc<<nb | u&(1<<nb-1)
		w.n += nb
		return
	}
	r := w.n + nb - 64 // the bits past a full accumulator
	w.out = binary.BigEndian.AppendUint64(w.out, w.acc<<(nb-r)|u>>r&(1<<(nb-r)-1))
	w.acc, w.n = u&(1<<r-1), r
}

// finish writes the pending bits, the last byte padded with zeros, and
// returns the chunk appended to dst.
func (w *xorWriter) finish() []byte {
	if w.n > 0 {
		pad := (8 - w.n%8) % 8
		v := w.acc << pad
		for k := int(w.n+pad) - 8; k >= 0; k -= 8 {
			w.out = append(w.out, byte(v>>uint(k)))
		}
		w.n = 0
	}
	return w.out
}

// appendXOR appends the XOR chunk of the samples ts, vs to dst.
func appendXOR(dst []byte, ts []int64, vs []float64) []byte {
	if len(ts) == 0 {
		return binary.BigEndian.AppendUint16(dst, 0)
	}
	prev := math.Float64bits(vs[0])
	w := startXOR(dst, len(ts), ts[0], prev)
	var prevD int64
	for i := 1; i < len(ts); i++ {
		d, x := ts[i]-ts[i-1], math.Float64bits(vs[i])
		if i == 1 {
			w.second(d, x^prev)
		} else {
			w.next(d-prevD, x^prev)
		}
		prevD, prev = d, x
	}
	return w.finish()
}
