package block

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// appendXOR appends the bytes of the TSDB's XOR chunk of n samples to dst
// (Prometheus' docs/format/chunks.md: a big-endian sample count, the first
// timestamp as a varint and value as 64 bits, the second timestamp's delta
// as a uvarint, then delta-of-deltas in 1, 16, 20, 24 or 68 bits, each value
// XOR the previous one with leading and trailing zeros left out). The
// samples come as the column form holds them: the first timestamp t0, then
// tds (n-1: the second timestamp's delta, then each delta-of-delta), and xs
// (n: each value's float bits XOR the previous value's, the first's XOR 0).
//
// It writes what chunkenc's xorAppender writes, sample by sample, but
// through a 64-bit accumulator instead of a bit at a time: decoding a frame
// of the column form writes every chunk of the frame again, and the
// appender's bit writes were most of that (47 ns a sample against 18).
// Encoding keeps a chunk in column form only when this gives back its
// bytes, so a sample this would write otherwise leaves the chunk verbatim,
// never wrong.
func appendXOR(dst []byte, t0 int64, tds []int64, xs []uint64) []byte {
	w := bitWriter{out: binary.BigEndian.AppendUint16(dst, uint16(len(xs)))}
	if len(xs) == 0 {
		return w.out
	}
	var buf [binary.MaxVarintLen64]byte
	for _, b := range buf[:binary.PutVarint(buf[:], t0)] {
		w.write(uint64(b), 8)
	}
	w.write(xs[0], 64)
	leading, trailing := uint8(0xff), uint8(0)
	for i, td := range tds {
		if i == 0 {
			for _, b := range buf[:binary.PutUvarint(buf[:], uint64(td))] {
				w.write(uint64(b), 8)
			}
		} else {
			w.dod(td)
		}
		w.value(xs[i+1], &leading, &trailing)
	}
	return w.finish()
}

// xorDeltas returns the samples ts, vs as appendXOR takes them, in tds and xs.
func xorDeltas(ts []int64, vs []float64, tds []int64, xs []uint64) ([]int64, []uint64) {
	tds, xs = tds[:0], xs[:0]
	var prevD int64
	var prev uint64
	for i, t := range ts {
		if i > 0 {
			d := t - ts[i-1]
			tds = append(tds, d-prevD)
			prevD = d
		}
		x := math.Float64bits(vs[i])
		xs = append(xs, x^prev)
		prev = x
	}
	return tds, xs
}

// bitWriter appends bits to out, most significant first, 64 at a time.
type bitWriter struct {
	out []byte
	acc uint64
	n   uint // pending bits: the low n bits of acc (up to 64)
}

// write writes the low nb ≤ 64 bits of u.
func (w *bitWriter) write(u uint64, nb uint) {
	if w.n+nb <= 64 {
		w.acc = w.acc<<nb | u&(1<<nb-1)
		w.n += nb
		return
	}
	r := w.n + nb - 64 // the bits past a full accumulator
	w.out = binary.BigEndian.AppendUint64(w.out, w.acc<<(nb-r)|u>>r&(1<<(nb-r)-1))
	w.acc, w.n = u&(1<<r-1), r
}

// dod writes a timestamp's delta-of-delta: 0, or a size code and the delta
// in 14, 17, 20 or 64 bits (a range of -(2^(k-1)-1) to 2^(k-1)).
func (w *bitWriter) dod(dod int64) {
	switch {
	case dod == 0:
		w.write(0, 1)
	case fitsBits(dod, 14):
		w.write(0b10<<14|uint64(dod)&(1<<14-1), 16)
	case fitsBits(dod, 17):
		w.write(0b110<<17|uint64(dod)&(1<<17-1), 20)
	case fitsBits(dod, 20):
		w.write(0b1110<<20|uint64(dod)&(1<<20-1), 24)
	default:
		w.write(0b1111, 4)
		w.write(uint64(dod), 64)
	}
}

func fitsBits(x int64, k uint) bool { return -(1<<(k-1)-1) <= x && x <= 1<<(k-1) }

// value writes a value XOR the previous one: 0 when equal, else 1, then 0
// and the bits between the previous leading and trailing zeros when the
// XOR fits in them, or 1, the leading zeros (at most 31) in 5 bits, the
// significant bits' count in 6 (64 as 0) and those bits.
func (w *bitWriter) value(x uint64, leading, trailing *uint8) {
	if x == 0 {
		w.write(0, 1)
		return
	}
	l, t := uint8(min(bits.LeadingZeros64(x), 31)), uint8(bits.TrailingZeros64(x))
	if *leading != 0xff && l >= *leading && t >= *trailing {
		w.write(0b10, 2)
		w.write(x>>*trailing, uint(64-*leading-*trailing))
		return
	}
	*leading, *trailing = l, t
	sig := 64 - l - t
	w.write(0b11<<11|uint64(l)<<6|uint64(sig&63), 13)
	w.write(x>>t, uint(sig))
}

// finish writes the pending bits, the last byte padded with zeros.
func (w *bitWriter) finish() []byte {
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
