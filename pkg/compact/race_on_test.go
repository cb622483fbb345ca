//go:build race

package compact_test

// raceEnabled shrinks the week test under the race detector.
const raceEnabled = true
