//go:build race

package bucketstore

// raceEnabled shrinks the heaviest tests under the race detector.
const raceEnabled = true
