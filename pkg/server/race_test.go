//go:build race

package server

// raceDetector: the race detector slows bcrypt about twentyfold, so tests
// that run many real checks run fewer under it.
const raceDetector = true
