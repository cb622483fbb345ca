//go:build !race

package compact_test

const raceEnabled = false
