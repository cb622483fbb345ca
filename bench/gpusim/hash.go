package gpusim

import "math"

// Every random-looking value in the simulator is a hash of (seed, identity,
// time or index): nothing depends on call order, so any two Cluster values
// built from the same Config agree on the state at any instant.

// mix is the splitmix64 finaliser: a cheap bijection with good avalanche.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

const golden = 0x9e3779b97f4a7c15

func h2(a, b uint64) uint64       { return mix(a ^ mix(b+golden)) }
func h3(a, b, c uint64) uint64    { return h2(h2(a, b), c) }
func h4(a, b, c, d uint64) uint64 { return h2(h3(a, b, c), d) }

// unit maps a hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) * (1.0 / (1 << 53)) }

// sym maps a hash to [-1, 1).
func sym(h uint64) float64 { return 2*unit(h) - 1 }

// pick returns a uniform value in [lo, hi).
func pick(h uint64, lo, hi float64) float64 { return lo + (hi-lo)*unit(h) }

// expo draws an exponential variate with the given mean.
func expo(h uint64, mean float64) float64 { return -math.Log(1-unit(h)) * mean }

// Salts keep the hash streams of different quantities apart.
const (
	saltWindowLen uint64 = iota + 1
	saltWindowPhase
	saltLayout
	saltSlot
	saltGPU
	saltNode
	saltNoise
	saltEvent
	saltJitter
	saltPod
	saltStep
	saltRank
)

// strHash hashes a string (FNV-1a), used for replica names and label sets.
func strHash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
