package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
)

// transformEstimate estimates what a reversible transform of a block's XOR
// chunks would take before zstd (issue 41 item 6, part 3): each chunk
// decoded and its samples stored as two column streams, timestamps as
// zigzag varints of their delta of deltas, values as zigzag varints of the
// deltas of decimal integers (v × 10^k, with the smallest k ≤ 9 that gives
// back every value of the chunk bit for bit; else the chunk's 8-byte float
// bits XOR-ed with the previous). Re-encoding the samples with the TSDB's
// XOR appender gives back the chunk (the appender is deterministic); this
// checks that for every chunk, so the figure is one a real encoding could
// reach. Only the columns are counted, compressed whole with zstd at the
// level the block encoding uses and at the best level; the index and the
// chunk lengths and references (small next to them) are not. The encoding
// built from it, in frames, is pkg/block's zstd-columns (-encodings).
func transformEstimate(dir string) error {
	b, err := tsdb.OpenBlock(nil, dir, chunkenc.NewPool(), nil)
	if err != nil {
		return err
	}
	defer b.Close()
	ir, err := b.Index()
	if err != nil {
		return err
	}
	defer ir.Close()
	cr, err := b.Chunks()
	if err != nil {
		return err
	}
	defer cr.Close()
	ctx := context.Background()
	k, v := index.AllPostingsKey()
	p, err := ir.Postings(ctx, k, v)
	if err != nil {
		return err
	}
	var (
		ts, vals, heads       []byte
		builder               labels.ScratchBuilder
		metas                 []chunks.Meta
		nChunks, nSamples     int
		decimal, floats, diff int
		chunkBytes            int
	)
	var tsBuf []int64
	var vBuf []float64
	for p.Next() {
		if err := ir.Series(p.At(), &builder, &metas); err != nil {
			return err
		}
		for _, m := range metas {
			c, _, err := cr.ChunkOrIterable(m)
			if err != nil {
				return err
			}
			if c.Encoding() != chunkenc.EncXOR {
				return fmt.Errorf("chunk encoding %s", c.Encoding())
			}
			chunkBytes += len(c.Bytes())
			tsBuf, vBuf = tsBuf[:0], vBuf[:0]
			it := c.Iterator(nil)
			for it.Next() == chunkenc.ValFloat {
				t, f := it.At()
				tsBuf = append(tsBuf, t)
				vBuf = append(vBuf, f)
			}
			if err := it.Err(); err != nil {
				return err
			}
			// Re-encode: the XOR appender must give the chunk back.
			re := chunkenc.NewXORChunk()
			app, _ := re.Appender()
			for i := range tsBuf {
				app.Append(0, tsBuf[i], vBuf[i])
			}
			if string(re.Bytes()) != string(c.Bytes()) {
				diff++
			}
			nChunks++
			nSamples += len(tsBuf)
			heads = binary.AppendUvarint(heads, uint64(len(tsBuf)))
			var prevT, prevD int64
			for i, t := range tsBuf {
				switch i {
				case 0:
					ts = binary.AppendVarint(ts, t-prevT) // from the chunk before: small
				case 1:
					prevD = t - prevT
					ts = binary.AppendVarint(ts, prevD)
				default:
					d := t - prevT
					ts = binary.AppendVarint(ts, d-prevD)
					prevD = d
				}
				prevT = t
			}
			if e, ok := decimalExp(vBuf); ok {
				decimal++
				heads = append(heads, byte(e))
				var prev int64
				for _, f := range vBuf {
					n := int64(math.Round(f * math.Pow10(e)))
					vals = binary.AppendVarint(vals, n-prev)
					prev = n
				}
			} else {
				floats++
				heads = append(heads, 0xff)
				var prev uint64
				for _, f := range vBuf {
					x := math.Float64bits(f)
					vals = binary.LittleEndian.AppendUint64(vals, x^prev)
					prev = x
				}
			}
		}
	}
	if err := p.Err(); err != nil {
		return err
	}
	fmt.Printf("%s: %d series chunks, %d samples, chunk data %d bytes (%.3f/sample); decimal chunks %d, float chunks %d, chunks not re-encoded identically %d\n",
		dir, nChunks, nSamples, chunkBytes, float64(chunkBytes)/float64(nSamples), decimal, floats, diff)
	for _, lvl := range []zstd.EncoderLevel{zstd.SpeedBestCompression} {
		enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(lvl), zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<26))
		var total int
		for _, s := range []struct {
			name string
			b    []byte
		}{{"chunk heads", heads}, {"timestamps", ts}, {"values", vals}} {
			n := len(enc.EncodeAll(s.b, nil))
			total += n
			fmt.Printf("  %-12s %10d bytes -> %9d zstd (%s) %.3f bytes/sample\n", s.name, len(s.b), n, lvl, float64(n)/float64(nSamples))
		}
		fmt.Printf("  columns in all: %d bytes, %.3f bytes/sample\n", total, float64(total)/float64(nSamples))
	}
	return nil
}

// decimalExp returns the smallest e ≤ 9 such that every value is an integer
// of 10^-e exactly (float64(n)/10^e gives back its bits), if there is one.
func decimalExp(vs []float64) (int, bool) {
	e := 0
	for _, f := range vs {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false
		}
		for ; e <= 9; e++ {
			n := math.Round(f * math.Pow10(e))
			if math.Abs(n) < 1<<53 && math.Float64bits(n/math.Pow10(e)) == math.Float64bits(f) {
				break
			}
		}
		if e > 9 {
			return 0, false
		}
	}
	// e grew along the way: check every value again at the final e.
	for _, f := range vs {
		n := math.Round(f * math.Pow10(e))
		if math.Float64bits(n/math.Pow10(e)) != math.Float64bits(f) {
			return 0, false
		}
	}
	return e, true
}
