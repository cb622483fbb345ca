//go:build !race

package bucketstore

const raceEnabled = false
