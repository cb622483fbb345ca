// Package compose holds the docker compose stack (compose.yaml and the config
// files it mounts). No container engine runs where the tests do, so the test
// in this folder loads compose.yaml with compose-go (the compose
// specification's schema, unknown keys rejected) and parses every mounted
// config file with its program's own loader. The package has no code: only
// its test imports compose-go and Alertmanager's config package.
package compose
