package kubernetes

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The Pod Security Standards' "restricted" profile (Kubernetes docs,
// concepts/security/pod-security-standards, "Restricted" and the "Baseline"
// rules it includes; as enforced by k8s.io/pod-security-admission's policy
// package at v1.37). The admission package itself is not imported: its
// module requires k8s.io/apiserver, whose etcd client would upgrade the one
// gpustore's binary links (through dskit's kv) for a test.
//
// restrictedViolations returns what a namespace labelled
// pod-security.kubernetes.io/enforce=restricted would reject in pod, one
// string per rule broken, naming the field.
func restrictedViolations(pod *corev1.PodSpec) []string {
	var v []string
	bad := func(format string, a ...any) { v = append(v, fmt.Sprintf(format, a...)) }
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}

	// Baseline: host namespaces, host ports, HostProcess, hostPath volumes,
	// sysctls, SELinux, AppArmor.
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		bad("hostNetwork/hostPID/hostIPC must be false")
	}
	if len(psc.Sysctls) > 0 {
		// The profile allows a few namespaced sysctls; gpustore sets none.
		bad("securityContext.sysctls %v: gpustore needs none", psc.Sysctls)
	}
	checkSELinux(psc.SELinuxOptions, "securityContext", bad)
	checkAppArmor(psc.AppArmorProfile, "securityContext", bad)
	if psc.WindowsOptions != nil && psc.WindowsOptions.HostProcess != nil && *psc.WindowsOptions.HostProcess {
		bad("securityContext.windowsOptions.hostProcess")
	}

	// Restricted: only these volume types (no hostPath, no other in-tree
	// driver).
	for _, vol := range pod.Volumes {
		s := vol.VolumeSource
		if s.ConfigMap == nil && s.CSI == nil && s.DownwardAPI == nil && s.EmptyDir == nil && s.Ephemeral == nil &&
			s.PersistentVolumeClaim == nil && s.Projected == nil && s.Secret == nil {
			bad("volume %s: type not allowed (configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret)", vol.Name)
		}
	}
	// Restricted: runAsNonRoot true and runAsUser not 0, seccomp
	// RuntimeDefault or Localhost: set on the pod, or on every container.
	podNonRoot := psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	if psc.RunAsNonRoot != nil && !*psc.RunAsNonRoot {
		bad("securityContext.runAsNonRoot is false")
	}
	if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		bad("securityContext.runAsUser is 0")
	}
	podSeccomp := psc.SeccompProfile != nil
	if podSeccomp && !seccompAllowed(psc.SeccompProfile) {
		bad("securityContext.seccompProfile.type %s: want RuntimeDefault or Localhost", psc.SeccompProfile.Type)
	}

	all := slices.Concat(pod.InitContainers, pod.Containers)
	for _, c := range pod.EphemeralContainers {
		all = append(all, corev1.Container(c.EphemeralContainerCommon))
	}
	for _, c := range all {
		at := "container " + c.Name
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				bad("%s: hostPort %d", at, p.HostPort)
			}
		}
		for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if p != nil && (p.HTTPGet != nil && p.HTTPGet.Host != "" || p.TCPSocket != nil && p.TCPSocket.Host != "") {
				bad("%s: %s probe sets a host", at, name)
			}
		}
		if sc.Privileged != nil && *sc.Privileged {
			bad("%s: privileged", at)
		}
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			bad("%s: procMount %s", at, *sc.ProcMount)
		}
		if sc.WindowsOptions != nil && sc.WindowsOptions.HostProcess != nil && *sc.WindowsOptions.HostProcess {
			bad("%s: windowsOptions.hostProcess", at)
		}
		checkSELinux(sc.SELinuxOptions, at, bad)
		checkAppArmor(sc.AppArmorProfile, at, bad)
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			bad("%s: securityContext.allowPrivilegeEscalation must be false", at)
		}
		switch {
		case sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot:
			bad("%s: securityContext.runAsNonRoot is false", at)
		case sc.RunAsNonRoot == nil && !podNonRoot:
			bad("%s: runAsNonRoot is set neither on the container nor on the pod", at)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			bad("%s: securityContext.runAsUser is 0", at)
		}
		switch {
		case sc.SeccompProfile != nil && !seccompAllowed(sc.SeccompProfile):
			bad("%s: seccompProfile.type %s: want RuntimeDefault or Localhost", at, sc.SeccompProfile.Type)
		case sc.SeccompProfile == nil && !podSeccomp:
			bad("%s: seccompProfile is set neither on the container nor on the pod (want RuntimeDefault)", at)
		}
		if caps := sc.Capabilities; caps == nil || !slices.Contains(caps.Drop, "ALL") {
			bad("%s: securityContext.capabilities.drop must contain ALL", at)
		} else {
			for _, a := range caps.Add {
				if a != "NET_BIND_SERVICE" {
					bad("%s: capabilities.add %s: only NET_BIND_SERVICE", at, a)
				}
			}
		}
	}
	return v
}

func seccompAllowed(p *corev1.SeccompProfile) bool {
	return p.Type == corev1.SeccompProfileTypeRuntimeDefault || p.Type == corev1.SeccompProfileTypeLocalhost
}

func checkSELinux(o *corev1.SELinuxOptions, at string, bad func(string, ...any)) {
	if o == nil {
		return
	}
	if !slices.Contains([]string{"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}, o.Type) {
		bad("%s: seLinuxOptions.type %s", at, o.Type)
	}
	if o.User != "" || o.Role != "" {
		bad("%s: seLinuxOptions.user/role must be unset", at)
	}
}

func checkAppArmor(p *corev1.AppArmorProfile, at string, bad func(string, ...any)) {
	if p != nil && p.Type == corev1.AppArmorProfileTypeUnconfined {
		bad("%s: appArmorProfile Unconfined", at)
	}
}

// Every pod template of every overlay passes the restricted profile: a
// namespace that enforces it admits them.
func TestPodsRestricted(t *testing.T) {
	for _, tc := range overlayCases {
		t.Run(filepath.Base(tc.overlay), func(t *testing.T) {
			o := render(t, tc.overlay)
			for _, name := range keys(o.pods()) {
				spec := &o.pods()[name].Spec
				for _, v := range restrictedViolations(spec) {
					t.Errorf("%s: %s", name, v)
				}
				// Beyond the profile: nothing written outside the volumes
				// (checkGpustorePod checks that what gpustore writes is on
				// a writable one).
				for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
					if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
						t.Errorf("%s: container %s: readOnlyRootFilesystem must be true", name, c.Name)
					}
				}
			}
		})
	}
}

// The check rejects each rule's violation on an otherwise restricted pod.
func TestRestrictedCheckRejects(t *testing.T) {
	ok := func() *corev1.PodSpec {
		yes, no := true, false
		return &corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &yes, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "c", SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: &no, Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			}}},
			Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		}
	}
	if v := restrictedViolations(ok()); len(v) != 0 {
		t.Fatalf("restricted pod rejected: %v", v)
	}
	zero, yes := int64(0), true
	for want, mutate := range map[string]func(p *corev1.PodSpec){
		"seccompProfile is set neither": func(p *corev1.PodSpec) { p.SecurityContext.SeccompProfile = nil },
		"Unconfined": func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: "Unconfined"}
		},
		"runAsNonRoot is set neither": func(p *corev1.PodSpec) { p.SecurityContext.RunAsNonRoot = nil },
		"runAsUser is 0":              func(p *corev1.PodSpec) { p.SecurityContext.RunAsUser = &zero },
		"allowPrivilegeEscalation":    func(p *corev1.PodSpec) { p.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil },
		"drop must contain ALL":       func(p *corev1.PodSpec) { p.Containers[0].SecurityContext.Capabilities = nil },
		"only NET_BIND_SERVICE": func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		},
		"privileged":  func(p *corev1.PodSpec) { p.Containers[0].SecurityContext.Privileged = &yes },
		"hostNetwork": func(p *corev1.PodSpec) { p.HostNetwork = true },
		"hostPort": func(p *corev1.PodSpec) {
			p.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
		},
		"type not allowed": func(p *corev1.PodSpec) {
			p.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}
		},
		"container init: securityContext.allowPrivilegeEscalation": func(p *corev1.PodSpec) {
			p.InitContainers = []corev1.Container{{Name: "init"}}
		},
	} {
		p := ok()
		mutate(p)
		if v := restrictedViolations(p); !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("want a violation %q, got %v", want, v)
		}
	}
}
