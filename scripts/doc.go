// Package scripts holds the shell scripts the Makefile runs (run.sh: `make
// run`); its tests run them against stand-ins for the binaries.
package scripts
