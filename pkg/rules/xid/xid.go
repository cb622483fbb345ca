// Package xid decodes NVIDIA Xid error codes for gpustore's GPU rule pack.
//
// dcgm-exporter reports DCGM_FI_DEV_XID_ERRORS as a gauge holding the code of
// the last Xid the driver logged for a GPU. A number alone does not tell an
// on-call engineer whether the GPU is broken or an application crashed, so
// this package keeps NVIDIA's catalogue of the codes used on Ampere and newer
// GPUs: NVIDIA's mnemonic, the GPUs it applies to, NVIDIA's immediate action
// ("resolution bucket"), a short meaning and the priority gpustore's alerts
// give the code.
//
// The table is data, catalog.tsv, transcribed from NVIDIA's "Analyzing Xid
// Errors with the Xid Catalog":
//
//	https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
//
// (the index of that documentation is https://docs.nvidia.com/deploy/xid-errors/).
// Its header records the date and what could not be confirmed. The meanings
// are our own short summaries, written for an alert; NVIDIA's catalogue is
// the authority when they disagree. `go generate ./pkg/rules/xid/` turns
// the TSV into catalog_gen.go (gen/table) and then into the rule file
// (gen/rules); tests fail while either generated file is stale.
//
// Prometheus alert templates cannot call Go, so the catalogue is also rendered
// as the recording rules of deploy/rules/xid-catalog.yml (series
// gpu:xid_catalog:info, one per code, value 1, the fields as labels). The
// GPUXidError alert joins that series to choose its priority and decodes the
// code in its annotations with the template function query. Run
// `go generate ./pkg/rules/xid/` after changing the table; a test fails while
// the YAML is out of date.
package xid

//go:generate go run ./gen/table -in catalog.tsv -o catalog_gen.go
//go:generate go run ./gen/rules -o ../../../deploy/rules/xid-catalog.yml

import (
	"fmt"
	"slices"
)

// Action is one of NVIDIA's "resolution buckets" for the immediate action
// after an Xid, spelled as in NVIDIA's catalogue.
type Action string

// The immediate actions used by the catalogue.
const (
	// RestartApp: restart the application; the GPU stays usable.
	RestartApp Action = "RESTART_APP"
	// ResetGPU: drain the GPU and reset it (or reboot the node).
	ResetGPU Action = "RESET_GPU"
	// RestartBM: reboot (power-cycle) the bare-metal node.
	RestartBM Action = "RESTART_BM"
	// Ignore: no immediate action needed.
	Ignore Action = "IGNORE"
	// ContactSupport: collect a bug report and contact NVIDIA or the vendor.
	ContactSupport Action = "CONTACT_SUPPORT"
	// CheckMechanicals: check power cables and seating of the board.
	CheckMechanicals Action = "CHECK_MECHANICALS"
	// WorkflowXid45: NVIDIA's decision flow for Xid 45: alone, restart the
	// Fabric Manager (RESTART_FM); with other Xids, follow those.
	WorkflowXid45 Action = "WORKFLOW_XID_45"
	// WorkflowXid48: NVIDIA's decision flow for uncorrectable ECC errors.
	WorkflowXid48 Action = "WORKFLOW_XID_48"
	// WorkflowNVLink: NVIDIA's decision flow for NVLink errors (Xid 74).
	WorkflowNVLink Action = "WORKFLOW_NVLINK_ERR"
	// WorkflowNVLink5: NVIDIA's decision flow for fifth-generation NVLink
	// errors (Xid 144-150), which depends on a subcode in the kernel log.
	WorkflowNVLink5 Action = "WORKFLOW_NVLINK5_ERR"
	// Xid154: follow the recovery action that the Xid 154 log line names.
	Xid154 Action = "XID_154"
	// RestartVM: restart the virtual machine the GPU is assigned to.
	RestartVM Action = "RESTART_VM"
	// UpdateSWFW: update the driver or firmware.
	UpdateSWFW Action = "UPDATE_SWFW"
	// CheckUVM: a GPU reset is needed if unified memory (UVM) was in use.
	CheckUVM Action = "CHECK_UVM"
	// Unconfirmed marks codes whose immediate action could not be confirmed
	// when the table was transcribed (see catalog.tsv).
	Unconfirmed Action = "UNCONFIRMED"
)

// Detail is a one-line instruction for the on-call, in our words.
func (a Action) Detail() string {
	switch a {
	case RestartApp:
		return "restart the affected application; the GPU can stay in service"
	case ResetGPU:
		return "drain the workloads from this GPU, then reset it (nvidia-smi -r) or reboot the node; if it recurs after the reset, contact your hardware vendor"
	case RestartBM:
		return "cordon and drain the node, then power-cycle it; if it recurs, check PCIe seating, risers and power, and start an RMA"
	case Ignore:
		return "no immediate action; watch for repeats and handle any Xid that accompanies it"
	case ContactSupport:
		return "collect nvidia-bug-report.sh output from the node and contact NVIDIA or your hardware vendor"
	case CheckMechanicals:
		return "check the board's auxiliary power cables and seating"
	case WorkflowXid45:
		return "if another Xid was logged with it, handle that one (Xid 45 is the teardown it caused); if Xid 45 came alone, restart the NVIDIA Fabric Manager on the node (RESTART_FM)"
	case WorkflowXid48:
		return "drain the GPU; the uncorrectable ECC error is cleared only by a GPU reset or node reboot; check ECC and row-remap counters against RMA thresholds"
	case WorkflowNVLink:
		return "drain the GPU, reset it or reboot the node, then check nvidia-smi nvlink -s here and on the peer GPU or NVSwitch; if it persists, contact your vendor"
	case WorkflowNVLink5:
		return "read the Xid subcode in the kernel log and follow NVIDIA's NVLink5 workflow for it; fatal subcodes need a GPU reset"
	case Xid154:
		return "read the Xid 154 line in the kernel log for the new recovery action (drain, GPU reset or node reboot) and carry it out"
	case RestartVM:
		return "drain the GPU and restart the virtual machine it is assigned to"
	case UpdateSWFW:
		return "update the GPU driver or firmware on the node, then retry"
	case CheckUVM:
		return "if the job used unified memory (UVM), drain and reset the GPU; otherwise restart the application"
	case Unconfirmed:
		return "read the Xid line in the node's kernel log and look the code up in NVIDIA's Xid catalog; treat it as needing a GPU reset until decoded"
	}
	return "look the code up in NVIDIA's Xid catalog"
}

// Priority is gpustore's alert priority, the P0/P1/P2 scale of the source
// document's "告警分级体系" table.
type Priority string

// Priorities, from most to least urgent.
const (
	P0 Priority = "P0" // urgent: respond within 5 minutes
	P1 Priority = "P1" // severe: respond within 15 minutes
	P2 Priority = "P2" // warning: respond within 1 hour
)

// Severity is the Alertmanager-style severity label that goes with a
// priority. The mapping is one to one across the whole rule pack.
func (p Priority) Severity() string {
	switch p {
	case P0:
		return "critical"
	case P1:
		return "warning"
	case P2:
		return "info"
	}
	return ""
}

// Entry describes one Xid code.
type Entry struct {
	Code      int
	Mnemonic  string   // NVIDIA's mnemonic
	AppliesTo []string // NVIDIA's "Applies to" columns (A100, H100, B100, GB200)
	Meaning   string   // short meaning, our words
	Action    Action   // NVIDIA's immediate action
	Priority  Priority
	// Why explains a priority that differs from DefaultPriority(Action).
	// Empty when the default applies.
	Why string
}

// Severity is the severity label that goes with the entry's priority.
func (e Entry) Severity() string { return e.Priority.Severity() }

// DefaultPriority is the priority the pack gives an Xid from its immediate
// action alone: actions that take the GPU or node out of service are P0,
// actions that need a person but not an outage are P1, and codes that only
// ask to restart an application or need nothing are P2, because the GPU
// itself stays healthy and the job owner (not the on-call) acts.
//
// Xid 154 is P2: the driver logs it when the GPU's recovery action changes;
// it is the announcement, not the action. The action itself is a state DCGM
// exports (field 1523), which GPURecoveryActionRequired pages at the
// priority DCGM's health check gives it (P0 for a reset or reboot); paging
// the Xid P0 too was a second page for one event. An unconfirmed action is
// P0: the catalogue row exists but its action could not be checked.
func DefaultPriority(a Action) Priority {
	switch a {
	case ResetGPU, RestartBM, RestartVM, WorkflowXid48, WorkflowNVLink, Unconfirmed:
		return P0
	case ContactSupport, CheckMechanicals, WorkflowNVLink5, UpdateSWFW, CheckUVM:
		return P1
	default:
		return P2
	}
}

// UnknownPriority is the priority of a code that is not in the catalogue.
// Drivers add codes past the catalogue (R620 logs a memory sparing event as
// Xid 185), so an unknown code is a person's question, not an outage: P1.
// When the GPU does need a reset, the driver sets its recovery action, which
// pages P0 on its own (GPURecoveryActionRequired).
const UnknownPriority = P1

// Lookup returns the catalogue entry for code.
func Lookup(code int) (Entry, bool) {
	i, ok := slices.BinarySearchFunc(catalog, code, func(e Entry, c int) int { return e.Code - c })
	if !ok {
		return Entry{}, false
	}
	return catalog[i], true
}

// Describe returns a one-line description of code for logs and alerts,
// with a fallback for codes outside the catalogue.
func Describe(code int) string {
	e, ok := Lookup(code)
	if !ok {
		return fmt.Sprintf("Xid %d: not in gpustore's catalogue; look it up in NVIDIA's Xid catalog", code)
	}
	return fmt.Sprintf("Xid %d %s: %s (%s, %s)", e.Code, e.Mnemonic, e.Meaning, e.Action, e.Priority)
}

// All returns the catalogue sorted by code. The slice is a copy.
func All() []Entry { return slices.Clone(catalog) }
